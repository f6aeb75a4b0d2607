"""PDF (pdfplumber): reading order with column detection, tables as Markdown, running
headers/footers removed, hyphenated line breaks joined, headings from font size.

Per page: tables are found once with pdfplumber's table finder and their words are taken
out of the running text; the remaining words are grouped into rows; vertical gutters are
found from the x-coverage of the rows' phrases; rows that cross a gutter (titles, page
headers) are read in place, the others column by column within their band. Rows that sit
in the top/bottom margin and repeat on many pages (digits ignored) are dropped first.
"""

from __future__ import annotations

import io
import logging
import re
import time
from collections import Counter
from typing import Any

import pdfplumber
from pdfminer.pdfdocument import PDFPasswordIncorrect
from pdfplumber.utils.exceptions import PdfminerException

from ingest_service.extract.base import MEDIA_PDF, ExtractionLimits
from ingest_service.extract.pdf_blocks import build_blocks, page_paragraphs
from ingest_service.extract.pdf_cleanup import join_lines, remove_repeated_margins
from ingest_service.extract.pdf_layout import Page, find_gutters, group_rows, order_lines, to_word
from ingest_service.extract.pdf_tables import inside_any, table_line
from ragrpc.errors import DocumentParseError, LimitExceededError, PasswordError, RagrpcError
from ragrpc.models import DocumentMetadata, ExtractedDocument

__all__ = [
    "PdfExtractor",
    "build_blocks",
    "find_gutters",
    "join_lines",
    "order_lines",
    "page_paragraphs",
    "pdf_date_to_iso",
    "remove_repeated_margins",
]

logger = logging.getLogger(__name__)

_PDF_DATE = re.compile(r"D?:?(\d{4})(\d{2})?(\d{2})?(\d{2})?(\d{2})?(\d{2})?\s*([Zz+\-])?(\d{2})?'?(\d{2})?")
_WORD_GAP_EM = 0.15  # a gap wider than this (in ems) between characters separates words


# ---------------------------------------------------------------- opening, metadata


def _open_pdf(data: bytes, password: str) -> Any:
    try:
        return pdfplumber.open(io.BytesIO(data), password=password)
    except PdfminerException as exc:
        inner = exc.args[0] if exc.args else exc
        if isinstance(inner, PDFPasswordIncorrect):
            if password:
                try:  # documents with an empty user password open whatever was sent
                    return pdfplumber.open(io.BytesIO(data), password="")
                except Exception:  # noqa: BLE001 - the original error is the one to report
                    pass
                raise PasswordError("wrong password for the encrypted PDF", field="password") from exc
            raise PasswordError(
                "the PDF is encrypted; send its password in DocumentSpec.password", field="password"
            ) from exc
        raise DocumentParseError(f"cannot read the PDF: {type(inner).__name__}: {inner}") from exc
    except Exception as exc:  # pdfminer raises many unrelated types on corrupt input
        raise DocumentParseError(f"cannot read the PDF: {type(exc).__name__}: {exc}") from exc


def pdf_date_to_iso(value: str) -> str:
    """'D:20200806055139-04'00'' -> '2020-08-06T05:51:39-04:00'; '' when unparseable."""
    match = _PDF_DATE.match(value.strip())
    if not match:
        return ""
    year, month, day, hour, minute, second, sign, tz_h, tz_m = match.groups()
    date = f"{year}-{month or '01'}-{day or '01'}"
    if hour is None:
        return date
    iso = f"{date}T{hour}:{minute or '00'}:{second or '00'}"
    if sign in ("Z", "z"):
        return iso + "Z"
    if sign in ("+", "-") and tz_h:
        return f"{iso}{sign}{tz_h}:{tz_m or '00'}"
    return iso


def _metadata_value(raw: Any) -> str:
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    return str(raw or "").replace("\x00", "").strip()


def _pdf_metadata(info: dict[str, Any], page_count: int) -> DocumentMetadata:
    values = {k: _metadata_value(v) for k, v in (info or {}).items()}
    extra = {k.lower(): values[k] for k in ("Subject", "Keywords", "Producer", "Creator") if values.get(k)}
    return DocumentMetadata(
        title=values.get("Title", ""),
        author=values.get("Author", ""),
        created=pdf_date_to_iso(values.get("CreationDate", "")),
        modified=pdf_date_to_iso(values.get("ModDate", "")),
        page_count=page_count,
        extra=extra,
    )


# ---------------------------------------------------------------- page reading


def _read_page(page: Any, number: int) -> Page:
    result = Page(number, float(page.width), float(page.height))
    # Tolerance relative to the font size: tight-set papers use gaps < 3 pt between words.
    raw_words = page.extract_words(x_tolerance_ratio=_WORD_GAP_EM, extra_attrs=["size", "fontname"])
    upright = [w for w in raw_words if w.get("upright", True)]
    size = (float(page.width), float(page.height))
    turn = ""
    # Counted in characters: a rotated margin stamp splits into many one-letter "words" and
    # would outnumber the words of a page with little upright text.
    if _characters(upright) >= 0.7 * _characters(raw_words):
        raw_words = upright  # drop rotated margin stamps
    else:  # the text runs vertically: read the page turned upright (the size ratio misfires there)
        raw_words = page.extract_words(extra_attrs=["fontname"])  # rotated glyph sizes vary per char
        raw_words = [w for w in raw_words if not w.get("upright", True)]
        turn = Counter(str(w.get("direction", "ttb")) for w in raw_words).most_common(1)[0][0]
        result.width, result.height = result.height, result.width
    words = [to_word(w, turn, size) for w in raw_words if w["text"].strip()]
    found = page.find_tables()
    tables = [line for line in (table_line(t, words, turn, size) for t in found) if line is not None]
    if tables:
        words = [w for w in words if not inside_any(w, tables)]
    result.tables = tables
    result.rows = group_rows(words)
    text_chars = sum(len(w.text) for w in words) + sum(len(t.table[0]) for t in tables if t.table)
    result.image_page = _mostly_image(page)
    result.without_text = text_chars == 0 or (text_chars < 20 and result.image_page)
    return result


def _close_pdf(pdf: Any) -> None:
    """Close without masking the real error: pdfplumber's close() walks pdf.pages again,
    which raises once more on a broken page tree."""
    try:
        pdf.close()
    except Exception as exc:  # noqa: BLE001 - the stream is in memory; nothing is left open
        logger.debug("closing a broken PDF: %s: %s", type(exc).__name__, exc)
        stream = getattr(pdf, "stream", None)
        if stream is not None:
            stream.close()


def _characters(words: list[dict[str, Any]]) -> int:
    return sum(len(str(w["text"])) for w in words)


def _mostly_image(page: Any) -> bool:
    area = float(page.width) * float(page.height) or 1.0
    covered = sum(abs((i["x1"] - i["x0"]) * (i["bottom"] - i["top"])) for i in page.images)
    return covered / area > 0.5


# ---------------------------------------------------------------- the extractor


class PdfExtractor:
    """application/pdf."""

    media_types: tuple[str, ...] = (MEDIA_PDF, "application/x-pdf")

    def __init__(self, limits: ExtractionLimits | None = None) -> None:
        self.limits = limits or ExtractionLimits()

    def extract(self, data: bytes, *, password: str = "") -> ExtractedDocument:
        if not data.strip():
            raise DocumentParseError("the PDF is empty (0 bytes)")
        pdf = _open_pdf(data, password)
        try:
            pages, metadata = self._read_pages(pdf)
        finally:
            _close_pdf(pdf)
        remove_repeated_margins(pages)
        for page in pages:  # image pages whose only text was a repeated stamp
            page.without_text = page.without_text or (page.image_page and not (page.rows or page.tables))
        paragraphs = [p for page in pages for p in page_paragraphs(page)]
        return ExtractedDocument(
            media_type=MEDIA_PDF,
            blocks=build_blocks(paragraphs),
            metadata=metadata,
            pages_without_text=[page.number for page in pages if page.without_text],
        )

    def _read_pages(self, pdf: Any) -> tuple[list[Page], DocumentMetadata]:
        try:
            page_objects = pdf.pages
            metadata = _pdf_metadata(pdf.metadata, len(page_objects))
        except Exception as exc:  # broken page tree / trailer
            raise DocumentParseError(f"cannot read the PDF pages: {type(exc).__name__}: {exc}") from exc
        if len(page_objects) > self.limits.max_pages:
            raise LimitExceededError(f"the PDF has {len(page_objects)} pages (limit {self.limits.max_pages})")
        deadline = time.monotonic() + self.limits.max_seconds
        pages: list[Page] = []
        for number, page in enumerate(page_objects, start=1):
            try:
                pages.append(_read_page(page, number))
            except RagrpcError:
                raise
            except Exception as exc:  # one broken page must not lose the document
                logger.warning("PDF page %s unreadable: %s: %s", number, type(exc).__name__, exc)
                pages.append(Page(number, 0.0, 0.0, without_text=True))
            finally:
                page.close()
            if time.monotonic() > deadline:
                raise LimitExceededError(f"PDF extraction took longer than {self.limits.max_seconds:.0f} s")
        return pages, metadata
