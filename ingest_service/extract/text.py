"""Plain text (and CSV): encoding detection that never fails, paragraphs on blank lines."""

from __future__ import annotations

import codecs
import csv
import io
import logging
import re

from charset_normalizer import from_bytes

from ingest_service.extract.base import MEDIA_CSV, MEDIA_TEXT, ExtractionLimits, markdown_table
from ragrpc.models import Block, BlockKind, ExtractedDocument

logger = logging.getLogger(__name__)

# Longest BOMs first: the UTF-32-LE BOM starts with the UTF-16-LE one.
_BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
_DETECTION_SAMPLE = 256 * 1024
_LATIN_SINGLE_BYTE = frozenset(
    "cp1250 cp1252 cp1254 cp1257 latin_1 iso8859_2 iso8859_3 iso8859_4 iso8859_9 iso8859_10 iso8859_13 "
    "iso8859_14 iso8859_15 iso8859_16 mac_roman mac_latin2 cp850 cp437".split()
)


def _bom_encoding(data: bytes) -> tuple[str, int] | None:
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            return encoding, len(bom)
    return None


def _utf16_without_bom(data: bytes) -> str | None:
    """UTF-16 text without a BOM shows NUL in every other byte (for Latin scripts)."""
    sample = data[:4096]
    if len(sample) < 4:
        return None
    even_nul = sample[0::2].count(0) / len(sample[0::2])
    odd_nul = sample[1::2].count(0) / len(sample[1::2])
    if odd_nul > 0.4 and even_nul < 0.05:
        return "utf-16-le"
    if even_nul > 0.4 and odd_nul < 0.05:
        return "utf-16-be"
    return None


def detect_encoding(data: bytes) -> str:
    """Best guess of the encoding of data; never raises (Latin-1 decodes anything)."""
    bom = _bom_encoding(data)
    if bom:
        return bom[0]
    utf16 = _utf16_without_bom(data)  # before UTF-8: NUL bytes are valid UTF-8
    if utf16:
        return utf16
    try:
        data.decode("utf-8")
        return "utf-8"
    except UnicodeDecodeError:
        pass
    best = from_bytes(data[:_DETECTION_SAMPLE]).best()
    guess = str(best.encoding) if best is not None and best.encoding else ""
    if not guess or guess in _LATIN_SINGLE_BYTE:
        return _prefer_cp1252(data, guess)
    return guess


def _letters(text: str) -> int:
    return sum(1 for c in text if ord(c) > 127 and c.isalpha())


def _prefer_cp1252(data: bytes, guess: str) -> str:
    """Short Western text is often mistaken for another Latin code page (cp1257, cp1250...):
    keep cp1252 unless the guess decodes into more letters."""
    sample = data[:_DETECTION_SAMPLE]
    try:
        cp1252_letters = _letters(sample.decode("cp1252"))
    except UnicodeDecodeError:
        return guess or "latin-1"
    if guess and _letters(sample.decode(guess, errors="replace")) > cp1252_letters:
        return guess
    return "cp1252"


def decode_text(data: bytes) -> str:
    """Bytes to str: BOM, strict UTF-8, UTF-16 without BOM, charset-normalizer, Latin-1.

    Invalid bytes become U+FFFD; this never raises. Line endings become \\n.
    """
    bom = _bom_encoding(data)
    encoding = detect_encoding(data)
    payload = data[bom[1] :] if bom else data
    try:
        text = payload.decode(encoding, errors="replace")
    except LookupError:  # an encoding name Python does not know
        logger.warning("unknown encoding %s; decoding as latin-1", encoding)
        text = payload.decode("latin-1")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def split_paragraphs(text: str) -> list[str]:
    """Paragraphs separated by blank lines; surrounding whitespace stripped."""
    return [p.strip() for p in _PARAGRAPH_BREAK.split(text) if p.strip()]


class TextExtractor:
    """text/plain: one PARAGRAPH block per blank-line separated paragraph."""

    media_types: tuple[str, ...] = (MEDIA_TEXT,)

    def __init__(self, limits: ExtractionLimits | None = None) -> None:
        self.limits = limits or ExtractionLimits()

    def extract(self, data: bytes, *, password: str = "") -> ExtractedDocument:
        text = decode_text(data)
        blocks = [Block(kind=BlockKind.PARAGRAPH, text=p) for p in split_paragraphs(text)]
        return ExtractedDocument(media_type=MEDIA_TEXT, blocks=blocks)


class CsvExtractor:
    """text/csv: the whole file as one Markdown TABLE block (first row = header)."""

    media_types: tuple[str, ...] = (MEDIA_CSV,)

    def __init__(self, limits: ExtractionLimits | None = None) -> None:
        self.limits = limits or ExtractionLimits()

    def extract(self, data: bytes, *, password: str = "") -> ExtractedDocument:
        text = decode_text(data)
        try:
            dialect: type[csv.Dialect] | csv.Dialect = csv.Sniffer().sniff(text[:8192], ",;\t|")
        except csv.Error:
            dialect = csv.excel
        rows: list[list[str]] = []
        cells = 0
        for row in csv.reader(io.StringIO(text), dialect):
            rows.append(row)
            cells += len(row)
            if cells > self.limits.max_table_cells:
                logger.warning("CSV cut at %s rows (max_table_cells)", len(rows))
                break
        table, header = markdown_table(rows)
        blocks = [Block(kind=BlockKind.TABLE, text=table, table_header=header)] if table else []
        return ExtractedDocument(media_type=MEDIA_CSV, blocks=blocks)
