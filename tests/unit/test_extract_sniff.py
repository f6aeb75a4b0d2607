"""Content sniffing (ingest_service.extract.sniff): bytes that are not text in any supported
format are refused as UNSUPPORTED_MEDIA_TYPE whatever their name or declared type says;
text in any encoding, and real documents, are still accepted."""

from __future__ import annotations

import bz2
import codecs
import gzip
import io
import lzma
import random
import struct
import tarfile
import zipfile

import docx
import pytest

from ingest_service.extract import build_default_registry, sniff_media_type
from ingest_service.extract.base import MEDIA_DOCX, MEDIA_MARKDOWN, MEDIA_PDF, MEDIA_TEXT
from ingest_service.extract.sniff import BINARY_DATA, text_verdict
from ragrpc.errors import DocumentParseError, UnsupportedMediaTypeError

PROSE = "Herons wade in shallow water and wait for fish. Storks migrate south when autumn comes. "


@pytest.fixture(scope="module")
def registry():
    return build_default_registry()


def _noise(size: int, seed: int = 7) -> bytes:
    return random.Random(seed).randbytes(size)


def _zip(entries: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, payload in entries.items():
            archive.writestr(name, payload)
    return out.getvalue()


def _tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        payload = PROSE.encode()
        info = tarfile.TarInfo("notes.txt")
        info.size = len(payload)
        archive.addfile(info, io.BytesIO(payload))
    return out.getvalue()


def _bmp() -> bytes:
    pixels = bytes(4 * 4 * 3)
    header = b"BM" + struct.pack("<IHHI", 54 + len(pixels), 0, 0, 54)
    info = struct.pack("<IiiHHIIiiII", 40, 4, 4, 1, 24, 0, len(pixels), 2835, 2835, 0, 0)
    return header + info + pixels


def _docx_bytes(text: str) -> bytes:
    document = docx.Document()
    document.add_heading("Birds", level=1)
    document.add_paragraph(text)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


BINARY_SAMPLES: list[tuple[str, bytes, str]] = [
    ("elf", b"\x7fELF\x02\x01\x01\x00" + bytes(8) + b"\x02\x00\x3e\x00" + _noise(2000), "ELF"),
    ("pe", b"MZ\x90\x00\x03\x00\x00\x00\x04\x00\x00\x00\xff\xff\x00\x00" + _noise(2000), "Windows PE"),
    ("macho-64", b"\xcf\xfa\xed\xfe\x07\x00\x00\x01" + _noise(2000), "Mach-O"),
    ("macho-32-be", b"\xfe\xed\xfa\xce\x00\x00\x00\x12" + _noise(2000), "Mach-O"),
    ("macho-fat", b"\xca\xfe\xba\xbe\x00\x00\x00\x02" + _noise(2000), "Mach-O"),
    ("png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + _noise(500), "PNG"),
    ("jpeg", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + _noise(500), "JPEG"),
    ("gif", b"GIF89a\x10\x00\x10\x00\x80\x00\x00" + _noise(500), "GIF"),
    ("webp", b"RIFF\x24\x01\x00\x00WEBPVP8 " + _noise(500), "WebP"),
    ("tiff-le", b"II*\x00\x08\x00\x00\x00" + _noise(500), "TIFF"),
    ("tiff-be", b"MM\x00*\x00\x00\x00\x08" + _noise(500), "TIFF"),
    ("bmp", _bmp(), "BMP"),
    ("gzip", gzip.compress(PROSE.encode() * 20), "gzip"),
    ("bzip2", bz2.compress(PROSE.encode() * 20), "bzip2"),
    ("xz", lzma.compress(PROSE.encode() * 20), "xz"),
    ("7z", b"7z\xbc\xaf\x27\x1c\x00\x04" + _noise(500), "7z"),
    ("rar", b"Rar!\x1a\x07\x01\x00" + _noise(500), "RAR"),
    ("tar", _tar(), "tar"),
    ("zip", _zip({"notes.txt": PROSE.encode()}), "zip archive"),
    ("xlsx", _zip({"[Content_Types].xml": b"<Types/>", "xl/workbook.xml": b"<workbook/>"}), "Excel"),
    ("pptx", _zip({"[Content_Types].xml": b"<Types/>", "ppt/presentation.xml": b"<p/>"}), "PowerPoint"),
    ("ole2", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(500), "legacy Office"),
    ("sqlite", b"SQLite format 3\x00\x10\x00\x01\x01" + bytes(500), "SQLite"),
    ("random", _noise(64 * 1024), BINARY_DATA),
]


@pytest.mark.parametrize(("label", "data", "what"), BINARY_SAMPLES, ids=[s[0] for s in BINARY_SAMPLES])
@pytest.mark.parametrize(("file_name", "media_type"), [("notes.txt", MEDIA_TEXT), ("README.md", ""), ("upload", "")])
def test_binary_content_is_refused_whatever_it_claims(
    registry, label: str, data: bytes, what: str, file_name: str, media_type: str
) -> None:
    with pytest.raises(UnsupportedMediaTypeError, match=what) as caught:
        registry.extract(data, file_name=file_name, media_type=media_type)
    assert caught.value.reason == "UNSUPPORTED_MEDIA_TYPE"
    assert MEDIA_PDF in caught.value.message  # lists what is supported


@pytest.mark.parametrize("size", [300, 4096, 5000, 1 << 20])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_bytes_are_refused(registry, size: int, seed: int) -> None:
    data = _noise(size, seed)
    for file_name, media_type in (("setup.exe", ""), ("notes.txt", MEDIA_TEXT), ("page.md", MEDIA_MARKDOWN)):
        with pytest.raises(UnsupportedMediaTypeError, match="binary data") as caught:
            registry.extract(data, file_name=file_name, media_type=media_type)
        assert caught.value.reason == "UNSUPPORTED_MEDIA_TYPE"


def test_text_with_a_binary_middle_or_tail_is_refused() -> None:
    """A self-extracting shell script (text header, compressed payload) is no document."""
    script = ("#!/bin/sh\n# installer\n" + PROSE * 100).encode()
    assert text_verdict(script) == ""
    assert text_verdict(script + gzip.compress(_noise(50_000))).startswith(BINARY_DATA)
    assert text_verdict(script + _noise(20_000) + script).startswith(BINARY_DATA)


def test_a_damaged_pdf_header_still_reaches_the_pdf_extractor(registry) -> None:
    """Binary content that ends like a PDF and is declared one is reported as a broken PDF."""
    data = b"%PDX-1.4\n" + _noise(3000) + b"\ntrailer\n<<>>\nstartxref\n123\n%%EOF\n"
    with pytest.raises(DocumentParseError, match="broken.pdf"):
        registry.extract(data, file_name="broken.pdf")
    with pytest.raises(UnsupportedMediaTypeError, match="binary data"):
        registry.extract(data, file_name="broken.txt")


TEXTS: list[tuple[str, bytes]] = [
    ("utf-8", (PROSE + "Café, naïve, Größe, 鳥, птица.").encode() * 30),
    ("utf-8-bom", codecs.BOM_UTF8 + PROSE.encode() * 30),
    ("utf-16-bom", (PROSE * 30).encode("utf-16")),
    ("utf-16-be-bom", codecs.BOM_UTF16_BE + (PROSE * 30).encode("utf-16-be")),
    ("utf-16-le-no-bom", (PROSE * 30).encode("utf-16-le")),
    ("utf-32-bom", (PROSE * 30).encode("utf-32")),
    ("latin-1", ("Café crème brûlée, naïve façade, Größe über alles. " * 60).encode("latin-1")),
    ("cp1252", ("“Quoted” text — with dashes… and €uros. " * 60).encode("cp1252")),
    ("cp1251", ("Съешь же ещё этих мягких французских булок, да выпей чаю. " * 60).encode("cp1251")),
    ("shift-jis", ("いろはにほへとちりぬるを わかよたれそつねならむ。" * 60).encode("shift_jis")),
    ("gbk", ("我能吞下玻璃而不伤身体。敏捷的棕色狐狸跳过了懒狗。" * 60).encode("gbk")),
    ("iso-2022-jp", ("いろはにほへと ちりぬるを。" * 60).encode("iso2022_jp")),  # ESC sequences
    ("nul-sprinkled", (PROSE.encode() + b"\x00") * 50),
    ("form-feeds", (PROSE.encode() * 5 + b"\f") * 20),
    ("ansi-colours", b"\x1b[32mINFO\x1b[0m service started on port 50051\n" * 100),
    ("few-controls", PROSE.encode() * 40 + b"\x01\x02\x07\x08\x1a" + PROSE.encode() * 40),
    ("starts-like-mz", b"MZ Wallace bags are made in New York. " + PROSE.encode() * 20),
    ("starts-like-bmp", b"BM: the benchmark notes. " + PROSE.encode() * 20),
    ("starts-like-gif", b"GIF89a is the animated variant of the format. " + PROSE.encode() * 20),
    ("starts-like-id3", b"ID3 tags carry the title of a song. " + PROSE.encode() * 20),
    ("invalid-utf-8-bytes", PROSE.encode() * 20 + b"\xff\xfe\xfd\xc3\x28\xa0" * 50 + PROSE.encode() * 20),
]


@pytest.mark.parametrize(("label", "data"), TEXTS, ids=[t[0] for t in TEXTS])
def test_text_in_any_encoding_is_accepted(registry, label: str, data: bytes) -> None:
    assert text_verdict(data) == "", label
    result = registry.extract(data, file_name="notes.txt")
    assert result.media_type == MEDIA_TEXT
    words = " ".join(b.text for b in result.blocks)
    assert len(words) > 100, label


@pytest.mark.parametrize("data", [b" ", b"\n\n\t  \r\n" * 100, b"\x01", b"a\x00b", b"x"])
def test_empty_ish_documents_behave_as_before(registry, data: bytes) -> None:
    """Whitespace and a stray control byte are text without words (the pipeline says NO_TEXT)."""
    result = registry.extract(data, file_name="blank.txt")
    assert result.media_type == MEDIA_TEXT
    with pytest.raises(DocumentParseError, match="empty"):
        registry.extract(b"", file_name="blank.txt")


def test_docx_is_accepted_under_any_name(registry) -> None:
    data = _docx_bytes("Kingfishers dive for small fish.")
    assert sniff_media_type(data) == (MEDIA_DOCX, "")
    for file_name, media_type in (("birds.docx", ""), ("upload.bin", "application/octet-stream"), ("a.txt", "")):
        result = registry.extract(data, file_name=file_name, media_type=media_type)
        assert result.media_type == MEDIA_DOCX
        assert any("Kingfishers" in b.text for b in result.blocks)


def test_nul_heavy_content_is_refused_as_binary(registry) -> None:
    for data in (bytes(10_000), b"\x00\x01\x02" * 10, bytes(range(32)) * 100):
        with pytest.raises(UnsupportedMediaTypeError, match="binary data"):
            registry.extract(data, file_name="b.bin")
