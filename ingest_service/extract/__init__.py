"""Document extraction: bytes of a supported format -> ExtractedDocument (blocks in reading order).

The registry picks the extractor by sniffing the content first (PDF magic, a zip holding
word/document.xml, an HTML document start, known binary signatures), then by the declared
media type, then by the file extension; textual content nobody claimed is read as plain text.
"""

from __future__ import annotations

import io
import logging
import zipfile
from collections.abc import Mapping
from pathlib import PurePath
from types import MappingProxyType

from ingest_service.extract.base import (
    MEDIA_CSV,
    MEDIA_DOCX,
    MEDIA_HTML,
    MEDIA_MARKDOWN,
    MEDIA_PDF,
    MEDIA_TEXT,
    ExtractionLimits,
    Extractor,
)
from ingest_service.extract.docx import DocxExtractor
from ingest_service.extract.html import HtmlExtractor
from ingest_service.extract.markdown import MarkdownExtractor
from ingest_service.extract.pdf import PdfExtractor
from ingest_service.extract.text import CsvExtractor, TextExtractor, decode_text
from ragrpc.errors import DocumentParseError, UnsupportedMediaTypeError
from ragrpc.models import ExtractedDocument

__all__ = [
    "SUPPORTED_MEDIA_TYPES",
    "ExtractionLimits",
    "Extractor",
    "ExtractorRegistry",
    "build_default_registry",
    "sniff_media_type",
]

logger = logging.getLogger(__name__)

SUPPORTED_MEDIA_TYPES: tuple[str, ...] = (
    MEDIA_PDF,
    MEDIA_DOCX,
    MEDIA_HTML,
    MEDIA_MARKDOWN,
    MEDIA_TEXT,
    MEDIA_CSV,
)

_EXTENSIONS: Mapping[str, str] = MappingProxyType(
    {
        ".pdf": MEDIA_PDF,
        ".docx": MEDIA_DOCX,
        ".html": MEDIA_HTML,
        ".htm": MEDIA_HTML,
        ".xhtml": MEDIA_HTML,
        ".md": MEDIA_MARKDOWN,
        ".markdown": MEDIA_MARKDOWN,
        ".mdown": MEDIA_MARKDOWN,
        ".txt": MEDIA_TEXT,
        ".text": MEDIA_TEXT,
        ".log": MEDIA_TEXT,
        ".rst": MEDIA_TEXT,
        ".csv": MEDIA_CSV,
    }
)
# Binary formats recognised only to refuse them with a precise message.
_BINARY_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "a legacy Office (OLE2) file: .doc/.xls/.ppt"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
    (b"II*\x00", "a TIFF image"),
    (b"MM\x00*", "a TIFF image"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"7z\xbc\xaf", "a 7z archive"),
    (b"Rar!", "a RAR archive"),
    (b"{\\rtf", "an RTF document"),
    (b"\x7fELF", "an executable"),
)
_ZIP_KINDS: tuple[tuple[str, str], ...] = (
    ("ppt/", "a PowerPoint (.pptx) presentation"),
    ("xl/", "an Excel (.xlsx) workbook"),
    ("content.xml", "an OpenDocument file"),
    ("META-INF/container.xml", "an EPUB book"),
)
_DAMAGED_ZIP = "a damaged zip archive"
_HTML_STARTS = ("<!doctype html", "<html", '<?xml version="1.0"?><!doctype html')


def _zip_kind(data: bytes) -> str:
    """MEDIA_DOCX for a Word archive, else a description of what the zip is."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, ValueError, OSError):
        return _DAMAGED_ZIP
    if "word/document.xml" in names:
        return MEDIA_DOCX
    for prefix, description in _ZIP_KINDS:
        if any(name.startswith(prefix) for name in names):
            return description
    return "a zip archive"


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


def _looks_binary(data: bytes) -> bool:
    sample = data[:4096]
    if sample.startswith((b"\xff\xfe", b"\xfe\xff", b"\xef\xbb\xbf")):
        return False
    zeros = sample.count(0)
    return zeros > 0 and zeros / max(1, len(sample)) > 0.3 and sample[1::2].count(0) < 0.9 * len(sample[1::2])


def sniff_media_type(data: bytes) -> tuple[str, str]:
    """(media type, "") when the content proves its format; ("", description) for a binary
    format that is known but unsupported; ("", "") when the content says nothing decisive."""
    if _looks_like_pdf(data):
        return MEDIA_PDF, ""
    if data.startswith(b"PK\x03\x04"):
        kind = _zip_kind(data)
        return (kind, "") if kind == MEDIA_DOCX else ("", kind)
    for signature, description in _BINARY_SIGNATURES:
        if data.startswith(signature):
            return "", description
    if _looks_binary(data):
        return "", "binary data"
    if _looks_like_html(decode_text(data[:2048])):
        return MEDIA_HTML, ""
    return "", ""


def _normalise_media_type(media_type: str) -> str:
    value = media_type.split(";")[0].strip().lower()
    aliases = {
        "application/xhtml+xml": MEDIA_HTML,
        "text/x-markdown": MEDIA_MARKDOWN,
        "application/x-pdf": MEDIA_PDF,
        "application/csv": MEDIA_CSV,
    }
    return aliases.get(value, value)


def _unsupported(what: str) -> UnsupportedMediaTypeError:
    return UnsupportedMediaTypeError(
        f"unsupported document format ({what}); supported media types: {', '.join(SUPPORTED_MEDIA_TYPES)}",
        field="media_type",
        metadata={"supported": ",".join(SUPPORTED_MEDIA_TYPES)},
    )


class ExtractorRegistry:
    """Maps media types to extractors and chooses one for given bytes."""

    def __init__(self, extractors: list[Extractor]) -> None:
        self._by_type: dict[str, Extractor] = {}
        for extractor in extractors:
            for media_type in extractor.media_types:
                self._by_type[media_type] = extractor

    @property
    def media_types(self) -> tuple[str, ...]:
        return tuple(self._by_type)

    def resolve(self, data: bytes, *, file_name: str = "", media_type: str = "") -> str:
        """The media type to extract data as; raises UnsupportedMediaTypeError."""
        sniffed, unsupported_kind = sniff_media_type(data)
        if sniffed:
            return sniffed
        declared = _normalise_media_type(media_type)
        by_extension = _EXTENSIONS.get(PurePath(file_name).suffix.lower(), "")
        if unsupported_kind == _DAMAGED_ZIP and MEDIA_DOCX in (declared, by_extension):
            return MEDIA_DOCX  # let the DOCX extractor report the damage
        if unsupported_kind:
            raise _unsupported(f"the content is {unsupported_kind}")
        if declared in self._by_type:
            return declared
        if by_extension:
            return by_extension
        if declared and not declared.startswith("text/"):
            raise _unsupported(f"declared media type {declared!r}")
        return MEDIA_TEXT

    def extract(
        self, data: bytes, *, file_name: str = "", media_type: str = "", password: str = ""
    ) -> ExtractedDocument:
        """Extract blocks from data; raises a RagrpcError subclass on any failure."""
        if not data:
            raise DocumentParseError("the document is empty (0 bytes)", field="content")
        chosen = self.resolve(data, file_name=file_name, media_type=media_type)
        extractor = self._by_type.get(chosen)
        if extractor is None:
            raise _unsupported(f"media type {chosen!r}")
        logger.debug("extracting %s (%s bytes) as %s", file_name or "<unnamed>", len(data), chosen)
        return extractor.extract(data, password=password)


def build_default_registry(limits: ExtractionLimits | None = None) -> ExtractorRegistry:
    """A registry with every built-in extractor sharing the given limits."""
    limits = limits or ExtractionLimits()
    return ExtractorRegistry(
        [
            PdfExtractor(limits),
            DocxExtractor(limits),
            HtmlExtractor(limits),
            MarkdownExtractor(limits),
            TextExtractor(limits),
            CsvExtractor(limits),
        ]
    )
