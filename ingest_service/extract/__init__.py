"""Document extraction: bytes of a supported format -> ExtractedDocument (blocks in reading order).

The registry picks the extractor by sniffing the content first (`sniff`: PDF magic, a zip
holding word/document.xml, an HTML document start; known binary signatures and bytes that
are not text are refused), then by the declared media type, then by the file extension;
textual content nobody claimed is read as plain text.

It is also the one place where a parser's failure becomes an input error: whatever a parser
raises on a file (pdfminer, python-docx, zipfile, lxml, decoding...) leaves `extract` as a
DocumentParseError (INVALID_ARGUMENT, reason DOCUMENT_UNREADABLE) naming the file, chained to
the original exception. Only faults of the service itself (MemoryError, a missing module)
pass through unchanged, to become INTERNAL above.
"""

from __future__ import annotations

import logging
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
from ingest_service.extract.sniff import BINARY_DATA, DAMAGED_ZIP, damaged_container, sniff_media_type
from ingest_service.extract.text import CsvExtractor, TextExtractor
from ragrpc.errors import DocumentParseError, RagrpcError, UnsupportedMediaTypeError
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
_LABELS: Mapping[str, str] = MappingProxyType(
    {
        MEDIA_PDF: "PDF",
        MEDIA_DOCX: "DOCX",
        MEDIA_HTML: "HTML",
        MEDIA_MARKDOWN: "Markdown",
        MEDIA_TEXT: "text",
        MEDIA_CSV: "CSV",
    }
)
# Raised inside a parser but faults of the service, not of the file: never turned into input errors.
_SERVICE_FAULTS: tuple[type[BaseException], ...] = (MemoryError, ImportError)
_MAX_DETAIL = 300  # characters of a parser's own message quoted in the error


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
        if unsupported_kind == DAMAGED_ZIP and MEDIA_DOCX in (declared, by_extension):
            return MEDIA_DOCX  # let the DOCX extractor report the damage
        if unsupported_kind.startswith(BINARY_DATA):
            damaged = damaged_container(data)  # a PDF or DOCX whose first bytes were damaged
            if damaged and damaged in (declared, by_extension):
                return damaged
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
        """Extract blocks from data; raises a RagrpcError subclass on any failure of the file."""
        if not data:
            named = f" {file_name!r}" if file_name else ""
            raise DocumentParseError(f"the document{named} is empty (0 bytes)", field="content")
        chosen = ""
        try:
            chosen = self.resolve(data, file_name=file_name, media_type=media_type)
            extractor = self._by_type.get(chosen)
            if extractor is None:
                raise _unsupported(f"media type {chosen!r}")
            logger.debug("extracting %s (%s bytes) as %s", file_name or "<unnamed>", len(data), chosen)
            return extractor.extract(data, password=password)
        except DocumentParseError as exc:
            if not file_name:
                raise
            raise _named(exc, file_name, chosen) from exc
        except RagrpcError:
            raise
        except _SERVICE_FAULTS:
            raise
        except Exception as exc:
            raise _parse_failure(exc, file_name, chosen) from exc


def _error_metadata(file_name: str, media_type: str) -> dict[str, str]:
    return {key: value for key, value in (("file_name", file_name), ("media_type", media_type)) if value}


def _named(exc: DocumentParseError, file_name: str, media_type: str) -> DocumentParseError:
    """The extractor's own DocumentParseError, with the file named in its message."""
    named = DocumentParseError(
        f"{file_name!r}: {exc.message}",
        reason=exc.reason,
        metadata={**_error_metadata(file_name, media_type), **exc.metadata},
    )
    named.field_violations = list(exc.field_violations)
    return named


def _parse_failure(exc: Exception, file_name: str, media_type: str) -> DocumentParseError:
    """An unexpected exception of a parser on a file: the file is unreadable, not the service broken."""
    detail = str(exc)
    if len(detail) > _MAX_DETAIL:
        detail = detail[:_MAX_DETAIL] + "..."
    what = _LABELS.get(media_type, media_type or "a document")
    name = repr(file_name) if file_name else "the document"
    logger.warning("cannot read %s as %s: %s: %s", name, what, type(exc).__name__, detail)
    logger.debug("parser traceback for %s", name, exc_info=exc)
    return DocumentParseError(
        f"cannot read {name} as {what} (the file is damaged or is not what it claims to be): "
        f"{type(exc).__name__}: {detail}",
        metadata=_error_metadata(file_name, media_type),
    )


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
