"""Content sniffing: what the bytes of an upload are, whatever its name or declared type says.

`sniff_media_type` answers in this order, the first match deciding:

1. PDF: ``%PDF-`` at the start (or after some junk, when the file also ends like a PDF).
2. Zip: DOCX when it holds ``word/document.xml``; any other zip (XLSX, PPTX, EPUB, ODF, a
   plain archive, a damaged one) is named so the registry can refuse it.
3. A known binary signature (executables, images, archives, media, databases): refused.
   Signatures made only of printable ASCII (``MZ``, ``BM``, ``GIF89a``...) count only when
   binary bytes follow them, so a text that happens to start with "MZ" is still text.
4. Not text at all: windows at the start, middle and end of the content are checked for
   C0 control bytes (NUL included; tab, newlines, form feed and ESC excepted). A window
   that is not valid UTF-8 (random bytes, or legacy 8-bit text) is binary above 5 % of
   control bytes (random bytes have ~10 %, Latin-1/cp1252/cp1251 text ~0 %); a valid UTF-8
   window above 30 % (random bytes are never valid UTF-8; NUL runs and low-byte data are).
   UTF-16/32 (BOM or NUL-interleaved) are decoded first and judged by their control and
   replacement characters (above 30 %). Windows with fewer than 4 control bytes pass.
5. HTML: a document start (``<!doctype html``, ``<html``...), in any encoding.

Anything else is ("", ""): the registry falls back to the declared type and the extension.
"""

from __future__ import annotations

import codecs
import io
import zipfile

from ingest_service.extract.base import MEDIA_DOCX, MEDIA_HTML, MEDIA_PDF
from ingest_service.extract.text import _bom_encoding, _utf16_without_bom, decode_text

__all__ = ["BINARY_DATA", "DAMAGED_ZIP", "damaged_container", "sniff_media_type", "text_verdict"]

DAMAGED_ZIP = "a damaged zip archive"
BINARY_DATA = "binary data, not text"

# (offset, magic, what the content is). Checked in order; longer magics of a family first.
_SIGNATURES: tuple[tuple[int, bytes, str], ...] = (
    (0, b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "a legacy Office (OLE2) file: .doc/.xls/.ppt"),
    (0, b"\x7fELF", "an executable (ELF)"),
    (0, b"MZ", "an executable (Windows PE/DOS)"),
    (0, b"\xfe\xed\xfa\xce", "an executable (Mach-O)"),
    (0, b"\xfe\xed\xfa\xcf", "an executable (Mach-O)"),
    (0, b"\xce\xfa\xed\xfe", "an executable (Mach-O)"),
    (0, b"\xcf\xfa\xed\xfe", "an executable (Mach-O)"),
    (0, b"\xca\xfe\xba\xbe", "an executable (Mach-O universal) or a Java class file"),
    (0, b"\x00asm", "a WebAssembly module"),
    (0, b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (0, b"\xff\xd8\xff", "a JPEG image"),
    (0, b"GIF87a", "a GIF image"),
    (0, b"GIF89a", "a GIF image"),
    (0, b"II*\x00", "a TIFF image"),
    (0, b"MM\x00*", "a TIFF image"),
    (0, b"BM", "a BMP image"),
    (0, b"\x00\x00\x01\x00", "an icon (ICO) image"),
    (0, b"\x1f\x8b", "a gzip archive"),
    (0, b"BZh", "a bzip2 archive"),
    (0, b"\xfd7zXZ\x00", "an xz archive"),
    (0, b"\x28\xb5\x2f\xfd", "a zstd archive"),
    (0, b"7z\xbc\xaf\x27\x1c", "a 7z archive"),
    (0, b"Rar!\x1a\x07", "a RAR archive"),
    (0, b"PK\x05\x06", "an empty zip archive"),
    (0, b"PK\x07\x08", "a spanned zip archive"),
    (257, b"ustar", "a tar archive"),
    (0, b"SQLite format 3\x00", "an SQLite database"),
    (0, b"ID3", "an MP3 audio file"),
    (0, b"OggS\x00", "an Ogg media file"),
    (0, b"fLaC", "a FLAC audio file"),
    (4, b"ftyp", "an MP4/QuickTime/HEIF media file"),
    (0, b"{\\rtf", "an RTF document"),
)
_RIFF_FORMS: tuple[tuple[bytes, str], ...] = (
    (b"WEBP", "a WebP image"),
    (b"WAVE", "a WAV audio file"),
    (b"AVI ", "an AVI video"),
)
_TEXT_FORMATS = frozenset({b"{\\rtf"})  # textual formats we refuse: no binary bytes need follow
_ZIP_KINDS: tuple[tuple[str, str], ...] = (
    ("ppt/", "a PowerPoint (.pptx) presentation"),
    ("xl/", "an Excel (.xlsx) workbook"),
    ("content.xml", "an OpenDocument file"),
    ("META-INF/container.xml", "an EPUB book"),
)
_HTML_STARTS = ("<!doctype html", "<html", '<?xml version="1.0"?><!doctype html')

# C0 controls that text does not contain: all but tab, LF, VT, FF, CR and ESC (ANSI colours).
_CONTROL_BYTES = bytes(b for b in range(32) if b not in (9, 10, 11, 12, 13, 27)) + b"\x7f"
_CONTROL_CHARS = frozenset(chr(b) for b in _CONTROL_BYTES) | {"\ufffd"}
_WINDOW = 4096
_MIN_CONTROLS = 4  # fewer control bytes than this never make a window binary (tiny inputs)
_MAX_SHARE_DECODED = 0.30  # valid UTF-8/16/32: random bytes never are; NUL runs and low-byte data are
_MAX_SHARE_8BIT = 0.05  # not UTF-8: random bytes show ~10 % C0 controls, legacy-encoded text ~0 %


def _zip_kind(data: bytes) -> str:
    """MEDIA_DOCX for a Word archive, else a description of what the zip is."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = archive.namelist()
    except Exception:  # noqa: BLE001 - zipfile raises many types on damaged archives
        return DAMAGED_ZIP
    if "word/document.xml" in names:
        return MEDIA_DOCX
    for prefix, description in _ZIP_KINDS:
        if any(name.startswith(prefix) for name in names):
            return description
    return "a zip archive"


def _printable(magic: bytes) -> bool:
    return all(32 <= byte < 127 for byte in magic)


def _signature_kind(data: bytes) -> str:
    """What a known binary signature says the content is; "" when none matches."""
    if data.startswith(b"RIFF"):
        for form, description in _RIFF_FORMS:
            if data[8:12] == form:
                return description
    for offset, magic, description in _SIGNATURES:
        if data[offset : offset + len(magic)] != magic:
            continue
        end = offset + len(magic)
        if magic in _TEXT_FORMATS or not _printable(magic) or _controls(data[end : end + 64]):
            return description
    return ""


def _controls(window: bytes) -> int:
    return len(window) - len(window.translate(None, _CONTROL_BYTES))


def _windows(data: bytes) -> list[tuple[int, bytes]]:
    """(offset, bytes) of the start, middle and end of data; all of it when it is short."""
    if len(data) <= 3 * _WINDOW:
        return [(0, data)]
    middle = len(data) // 2 - _WINDOW // 2
    return [(0, data[:_WINDOW]), (middle, data[middle : middle + _WINDOW]), (len(data) - _WINDOW, data[-_WINDOW:])]


def _valid_utf8(window: bytes, at_start: bool) -> bool:
    """Whether window is UTF-8, allowing a character cut at either edge of the window."""
    skip = 0
    while not at_start and skip < 3 and skip < len(window) and 0x80 <= window[skip] <= 0xBF:
        skip += 1
    try:
        codecs.getincrementaldecoder("utf-8")().decode(window[skip:], final=False)
    except UnicodeDecodeError:
        return False
    return True


def _wide_verdict(data: bytes, encoding: str, bom_length: int) -> str:
    width = 4 if "32" in encoding else 2
    sample = data[bom_length : bom_length + 4 * _WINDOW]
    sample = sample[: len(sample) - len(sample) % width]
    text = sample.decode(encoding, errors="replace")
    bad = sum(1 for char in text if char in _CONTROL_CHARS)
    if bad >= _MIN_CONTROLS and bad > _MAX_SHARE_DECODED * len(text):
        return f"{BINARY_DATA} ({encoding} with {100 * bad // max(1, len(text))} % control characters)"
    return ""


def text_verdict(data: bytes) -> str:
    """Empty when data reads as text in some encoding, else a description of why it does not."""
    bom = _bom_encoding(data)
    if bom and bom[0] != "utf-8":
        return _wide_verdict(data, bom[0], bom[1])
    utf16 = None if bom else _utf16_without_bom(data)
    if utf16:
        return _wide_verdict(data, utf16, 0)
    for offset, window in _windows(data):
        controls = _controls(window)
        if controls < _MIN_CONTROLS:
            continue
        limit = _MAX_SHARE_DECODED if _valid_utf8(window, at_start=offset == 0) else _MAX_SHARE_8BIT
        if controls > limit * len(window):
            return f"{BINARY_DATA} ({100 * controls // len(window)} % control bytes at offset {offset})"
    return ""


def damaged_container(data: bytes) -> str:
    """The media type whose trailer the content ends with (a PDF or a zip whose start was
    damaged), so a declared PDF/DOCX gets its extractor's own diagnosis; "" otherwise."""
    tail = data[-2048:]
    if b"%%EOF" in tail or b"startxref" in tail:
        return MEDIA_PDF
    if b"PK\x05\x06" in data[-(65536 + 22) :]:
        return MEDIA_DOCX
    return ""


def _looks_like_html(head: str) -> bool:
    start = head.lstrip().lower()
    if start.startswith(_HTML_STARTS):
        return True
    return start.startswith(("<head", "<body")) or ("<html" in start[:512] and "<body" in start)


def _looks_like_pdf(data: bytes) -> bool:
    """%PDF- at the start, or after some junk when the file also ends like a PDF."""
    if data.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"%PDF-"):
        return True
    return b"%PDF-" in data[:1024] and b"%%EOF" in data[-2048:]


def sniff_media_type(data: bytes) -> tuple[str, str]:
    """(media type, "") when the content proves its format; ("", description) for content
    that is known to be no supported document (binary formats, zips that are not DOCX,
    bytes that are not text); ("", "") when the content says nothing decisive."""
    if _looks_like_pdf(data):
        return MEDIA_PDF, ""
    if data.startswith(b"PK\x03\x04"):
        kind = _zip_kind(data)
        return (kind, "") if kind == MEDIA_DOCX else ("", kind)
    kind = _signature_kind(data) or text_verdict(data)
    if kind:
        return "", kind
    if _looks_like_html(decode_text(data[:2048])):
        return MEDIA_HTML, ""
    return "", ""
