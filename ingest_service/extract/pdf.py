"""PDF (pdfplumber): reading order with column detection, tables as Markdown, running
headers/footers removed, hyphenated line breaks joined, headings from font size.

Per page: tables are found once with pdfplumber's table finder and their words are taken
out of the running text; the remaining words are grouped into rows; vertical gutters are
found from the x-coverage of the rows' phrases; rows that cross a gutter (titles, page
headers) are read in place, the others column by column within their band. Rows that sit
in the top/bottom margin and repeat on many pages (digits ignored) are dropped first.
"""

from __future__ import annotations

import bisect
import io
import logging
import math
import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pdfplumber
from pdfminer.pdfdocument import PDFPasswordIncorrect
from pdfplumber.utils.exceptions import PdfminerException

from ingest_service.clean import is_boilerplate_line
from ingest_service.extract.base import MEDIA_PDF, ExtractionLimits, SectionTracker, markdown_table
from ragrpc.errors import DocumentParseError, LimitExceededError, PasswordError, RagrpcError
from ragrpc.models import Block, BlockKind, DocumentMetadata, ExtractedDocument

logger = logging.getLogger(__name__)

_BULLET = re.compile(r"^(?:[•◦▪▫‣∙●○■□➢►–]|[-*])\s+")
_NUMBERED = re.compile(r"^(?:\d{1,2}|[a-z]|[ivx]{1,4})[.)]\s+\S")
_PDF_DATE = re.compile(r"D?:?(\d{4})(\d{2})?(\d{2})?(\d{2})?(\d{2})?(\d{2})?\s*([Zz+\-])?(\d{2})?'?(\d{2})?")
_MARGIN_KEY_EDGES = re.compile(r"^[\d\W_]+|[\d\W_]+$")
_DIGITS = re.compile(r"\d+")
_COMPOUND_PREFIXES = frozenset("non self co anti multi post pre well cross semi ex".split())
_MARGIN_ZONE = 0.12  # fraction of the page height at top and bottom where running headers live
_MARGIN_ROWS = 3
_WORD_GAP_EM = 0.15  # a gap wider than this (in ems) between characters separates words


@dataclass(slots=True)
class _Word:
    x0: float
    x1: float
    top: float
    bottom: float
    text: str
    size: float
    bold: bool


@dataclass(slots=True)
class _Line:
    """One row (or one column's part of a row) in reading order; or a table."""

    words: list[_Word]
    column: int = 0
    band: int = 0
    table: tuple[str, str, str] | None = None  # (markdown, header, caption)
    top: float = 0.0
    bottom: float = 0.0
    x0: float = 0.0
    x1: float = 0.0

    def __post_init__(self) -> None:
        if self.words:
            self.top = min(w.top for w in self.words)
            self.bottom = max(w.bottom for w in self.words)
            self.x0 = self.words[0].x0
            self.x1 = self.words[-1].x1

    @property
    def text(self) -> str:
        return " ".join(w.text for w in self.words)

    @property
    def size(self) -> float:
        return statistics.median(w.size for w in self.words) if self.words else 0.0


@dataclass
class _Page:
    number: int
    width: float
    height: float
    rows: list[list[_Word]] = field(default_factory=list)
    tables: list[_Line] = field(default_factory=list)
    without_text: bool = False
    image_page: bool = False


@dataclass
class _Paragraph:
    kind: BlockKind
    text: str
    page: int
    size: float = 0.0
    bold: bool = False
    lines: int = 1
    table_header: str = ""


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


# ---------------------------------------------------------------- tables


def _split_stacked_row(row: list[str]) -> list[list[str]]:
    """A row whose filled cells all hold the same number (>1) of lines is that many rows
    (tables ruled every few rows only, e.g. five states per ruled row)."""
    counts = {cell.count("\n") + 1 for cell in row if cell.strip()}
    filled = sum(1 for cell in row if cell.strip())
    if filled < 2 or len(counts) != 1 or (n := counts.pop()) < 2:
        return [row]
    return [[cell.split("\n")[k] if cell.strip() else "" for cell in row] for k in range(n)]


Box = tuple[float, float, float, float]  # x0, top, x1, bottom


def _turn(box: Box, turn: str, width: float, height: float) -> Box:
    """A box of a page whose text runs vertically, in the coordinates of the page turned upright."""
    x0, top, x1, bottom = box
    if turn == "ttb":
        return top, width - x1, bottom, width - x0
    if turn == "btt":
        return height - bottom, x0, height - top, x1
    return box


def _cell_words(cells: list[Box], words: list[_Word]) -> list[list[list[_Word]]]:
    """Words of each grid position (rows by cell top, columns by cell left edge); a word goes
    to the cell holding its centre, found through per-row buckets, not by scanning all cells."""
    tops = sorted({round(c[1], 1) for c in cells})
    lefts = sorted({round(c[0], 1) for c in cells})
    grid: list[list[list[_Word]]] = [[[] for _ in lefts] for _ in tops]
    buckets: list[list[tuple[Box, int, int]]] = [[] for _ in tops]
    for cell in cells:
        row, col = tops.index(round(cell[1], 1)), lefts.index(round(cell[0], 1))
        last = bisect.bisect_left(tops, round(cell[3], 1)) - 1
        for r in range(row, max(row, last) + 1):
            buckets[r].append((cell, row, col))
    for word in words:
        cx, cy = (word.x0 + word.x1) / 2, (word.top + word.bottom) / 2
        r = bisect.bisect_right(tops, cy) - 1
        for cell, row, col in buckets[r] if r >= 0 else ():
            if cell[0] <= cx <= cell[2] and cell[1] <= cy <= cell[3]:
                grid[row][col].append(word)
                break
    return grid


def _cell_text(words: list[_Word]) -> str:
    return "\n".join(" ".join(w.text for w in row) for row in _group_rows(words))


def _table_line(table: Any, words: list[_Word], turn: str, size: tuple[float, float]) -> _Line | None:
    """A pdfplumber table as a positioned Markdown table, or None if it is not a real table."""
    cells = [_turn(tuple(float(v) for v in c), turn, *size) for c in table.cells]  # type: ignore[arg-type]
    if not cells:
        return None
    rows = [[_cell_text(cell) for cell in row] for row in _cell_words(cells, words)]
    if len(rows) < 2:
        return None
    caption = ""
    if len(rows) >= 3 and len(rows[0]) > 2 and sum(1 for c in rows[0] if c.strip()) == 1:
        caption = join_lines(next(c for c in rows[0] if c.strip()).split("\n"))
        rows = rows[1:]
    expanded = rows[:1] + [split for row in rows[1:] for split in _split_stacked_row(row)]
    text, header = markdown_table([[join_lines(cell.split("\n")) for cell in row] for row in expanded])
    if not text or header.count("---") < 2 or text.count("\n") < 2:
        return None
    x0, top, x1, bottom = _turn(tuple(float(v) for v in table.bbox), turn, *size)  # type: ignore[arg-type]
    return _Line(words=[], table=(text, header, caption), top=top, bottom=bottom, x0=x0, x1=x1)


# ---------------------------------------------------------------- page reading


def _to_word(w: dict[str, Any], turn: str, size: tuple[float, float]) -> _Word:
    font = str(w.get("fontname", "")).lower()
    x0, top, x1, bottom = _turn(
        (float(w["x0"]), float(w["top"]), float(w["x1"]), float(w["bottom"])), turn, *size
    )
    return _Word(
        x0,
        x1,
        top,
        bottom,
        str(w["text"]),
        float(w.get("size") or (bottom - top)),
        any(k in font for k in ("bold", "black", "heavy", "semibold")),
    )


def _group_rows(words: list[_Word]) -> list[list[_Word]]:
    """Words of one visual line together: sorted by top, a word joins the current row when
    it overlaps the row's first word vertically by at least half a height."""
    rows: list[list[_Word]] = []
    ref: _Word | None = None
    for word in sorted(words, key=lambda w: (w.top, w.x0)):
        if ref is not None:
            overlap = min(ref.bottom, word.bottom) - max(ref.top, word.top)
            if overlap >= 0.5 * min(ref.bottom - ref.top, word.bottom - word.top):
                rows[-1].append(word)
                continue
        rows.append([word])
        ref = word
    for row in rows:
        row.sort(key=lambda w: w.x0)
    return rows


def _read_page(page: Any, number: int) -> _Page:
    result = _Page(number, float(page.width), float(page.height))
    # Tolerance relative to the font size: tight-set papers use gaps < 3 pt between words.
    raw_words = page.extract_words(x_tolerance_ratio=_WORD_GAP_EM, extra_attrs=["size", "fontname"])
    upright = [w for w in raw_words if w.get("upright", True)]
    size = (float(page.width), float(page.height))
    turn = ""
    if len(upright) >= 0.7 * len(raw_words):
        raw_words = upright  # drop rotated margin stamps
    else:  # the text runs vertically: read the page turned upright (the size ratio misfires there)
        raw_words = page.extract_words(extra_attrs=["fontname"])  # rotated glyph sizes vary per char
        raw_words = [w for w in raw_words if not w.get("upright", True)]
        turn = Counter(str(w.get("direction", "ttb")) for w in raw_words).most_common(1)[0][0]
        result.width, result.height = result.height, result.width
    words = [_to_word(w, turn, size) for w in raw_words if w["text"].strip()]
    found = page.find_tables()
    tables = [line for line in (_table_line(t, words, turn, size) for t in found) if line is not None]
    if tables:
        words = [w for w in words if not _inside_any(w, tables)]
    result.tables = tables
    result.rows = _group_rows(words)
    text_chars = sum(len(w.text) for w in words) + sum(len(t.table[0]) for t in tables if t.table)
    result.image_page = _mostly_image(page)
    result.without_text = text_chars == 0 or (text_chars < 20 and result.image_page)
    return result


def _inside_any(word: _Word, tables: list[_Line]) -> bool:
    cx, cy = (word.x0 + word.x1) / 2, (word.top + word.bottom) / 2
    return any(t.x0 - 1 <= cx <= t.x1 + 1 and t.top - 1 <= cy <= t.bottom + 1 for t in tables)


def _mostly_image(page: Any) -> bool:
    area = float(page.width) * float(page.height) or 1.0
    covered = sum(abs((i["x1"] - i["x0"]) * (i["bottom"] - i["top"])) for i in page.images)
    return covered / area > 0.5


# ---------------------------------------------------------------- running headers / footers


def _margin_rows(page: _Page) -> set[int]:
    """Indices of the first/last rows that sit in the top/bottom margin zone."""
    found: set[int] = set()
    for i, row in enumerate(page.rows[:_MARGIN_ROWS]):
        if row[0].top < _MARGIN_ZONE * page.height:
            found.add(i)
    last = len(page.rows) - 1
    for i in range(last, max(last - _MARGIN_ROWS, -1), -1):
        if max(w.bottom for w in page.rows[i]) > (1 - _MARGIN_ZONE) * page.height:
            found.add(i)
    return found


def _margin_key(row: list[_Word]) -> str:
    text = _MARGIN_KEY_EDGES.sub("", " ".join(w.text for w in row).lower())
    return _DIGITS.sub("#", text).replace(" ", "")


def remove_repeated_margins(pages: list[_Page]) -> None:
    """Drop header/footer rows repeating on many pages, and page counters in the margins."""
    candidates = [_margin_rows(page) for page in pages]
    counts: Counter[str] = Counter()
    for page, rows in zip(pages, candidates, strict=True):
        counts.update({_margin_key(page.rows[i]) for i in rows} - {""})
    threshold = max(2, math.ceil(0.4 * len(pages)))
    for page, rows in zip(pages, candidates, strict=True):
        page.rows = [
            row
            for i, row in enumerate(page.rows)
            if i not in rows
            or not (
                counts[_margin_key(row)] >= threshold or is_boilerplate_line(" ".join(w.text for w in row))
            )
        ]


# ---------------------------------------------------------------- columns and reading order


def _phrases(row: list[_Word], max_gap_em: float = 0.6) -> list[tuple[float, float]]:
    """x-extents of the runs of words in a row that are less than max_gap_em apart."""
    spans: list[tuple[float, float]] = []
    start, end = row[0].x0, row[0].x1
    for word in row[1:]:
        if word.x0 - end > max_gap_em * max(word.bottom - word.top, 1.0):
            spans.append((start, end))
            start = word.x0
        end = max(end, word.x1)
    spans.append((start, end))
    return spans


def _coverage(rows: list[list[_Word]], width: int) -> list[int]:
    diff = [0] * (width + 2)
    for row in rows:
        for x0, x1 in _phrases(row):
            diff[max(0, min(width, int(x0)))] += 1
            diff[max(0, min(width, math.ceil(x1)))] -= 1
    coverage, running = [], 0
    for delta in diff:
        running += delta
        coverage.append(running)
    return coverage


def _low_runs(
    coverage: list[int], left: int, right: int, limit: float, min_width: int
) -> list[tuple[int, int]]:
    runs, start = [], None
    for x in range(left, right + 1):
        if coverage[x] <= limit and x < right:
            start = x if start is None else start
        elif start is not None:
            if x - start >= min_width:
                runs.append((start, x))
            start = None
    return runs


def find_gutters(rows: list[list[_Word]], page_width: float) -> list[tuple[float, float]]:
    """Vertical white channels between text columns: x ranges covered by few rows, with
    well-filled columns (at least 18% of the text width, lines reaching their right edge) on
    both sides."""
    if len(rows) < 8:
        return []
    width = int(page_width) + 2
    coverage = _coverage(rows, width)
    left = max(0, int(min(r[0].x0 for r in rows)))
    right = min(width, math.ceil(max(r[-1].x1 for r in rows)))
    inside = sorted(coverage[left:right])
    if not inside:
        return []
    peak = inside[int(0.9 * (len(inside) - 1))]
    em = statistics.median(w.bottom - w.top for r in rows for w in r)
    runs = _low_runs(coverage, left, right, 0.35 * peak, max(3, int(0.6 * em)))
    runs = [
        _emptiest_part(coverage, a, b, peak)
        for a, b in runs
        if max(coverage[left:a] or [0]) >= 0.5 * peak and max(coverage[b:right] or [0]) >= 0.5 * peak
    ]
    return _keep_filled_columns(rows, [(float(a), float(b)) for a, b in runs], left, right)


def _emptiest_part(coverage: list[int], start: int, end: int, peak: int) -> tuple[int, int]:
    """Narrow a low-coverage run to its emptiest part (ragged line ends eat into gutters)."""
    floor = min(coverage[start:end]) + max(1, 0.05 * peak)
    emptiest = [x for x in range(start, end) if coverage[x] <= floor]
    return emptiest[0], emptiest[-1] + 1


def _keep_filled_columns(
    rows: list[list[_Word]], gutters: list[tuple[float, float]], left: float, right: float
) -> list[tuple[float, float]]:
    kept: list[tuple[float, float]] = []
    col_start = left
    for gutter in gutters:
        col_end = gutter[0]
        ends = [
            max(w.x1 for w in row if col_start <= (w.x0 + w.x1) / 2 < col_end)
            for row in rows
            if any(col_start <= (w.x0 + w.x1) / 2 < col_end for w in row)
        ]
        wide_enough = col_end - col_start >= 0.18 * (right - left) and right - gutter[1] >= 0.18 * (
            right - left
        )
        edge = max(ends, default=col_start)
        filled = sum(1 for e in ends if e >= edge - 0.2 * (col_end - col_start))
        if wide_enough and len(ends) >= 4 and filled >= 0.5 * len(ends):
            kept.append(gutter)
            col_start = gutter[1]
    return kept


def order_lines(page: _Page) -> list[_Line]:
    """Rows and tables in reading order: spanning rows in place, others column by column."""
    gutters = find_gutters(page.rows, page.width)
    centers = [(a + b) / 2 for a, b in gutters]
    items: list[tuple[float, list[_Word] | _Line]] = [(row[0].top, row) for row in page.rows]
    items += [(t.top, t) for t in page.tables]
    items.sort(key=lambda item: item[0])
    ordered: list[_Line] = []
    band: list[_Line] = []
    band_id = 0

    def flush() -> None:
        nonlocal band_id
        ordered.extend(sorted(band, key=lambda line: (line.column, line.top)))
        band.clear()
        band_id += 1

    for _, item in items:
        spans = [(item.x0, item.x1)] if isinstance(item, _Line) else _phrases(item, 0.45)
        if any(a < c < b for a, b in spans for c in centers):
            flush()
            line = item if isinstance(item, _Line) else _Line(item)
            line.band, line.column = band_id, -1
            ordered.append(line)
            band_id += 1
            continue
        band.extend(_split_by_columns(item, centers, band_id))
    flush()
    return ordered


def _split_by_columns(item: list[_Word] | _Line, centers: list[float], band_id: int) -> list[_Line]:
    def column_of(x: float) -> int:
        return sum(1 for c in centers if x > c)

    if isinstance(item, _Line):
        item.band, item.column = band_id, column_of((item.x0 + item.x1) / 2)
        return [item]
    parts: dict[int, list[_Word]] = {}
    for word in item:
        parts.setdefault(column_of((word.x0 + word.x1) / 2), []).append(word)
    return [_Line(words, column=col, band=band_id) for col, words in parts.items()]


# ---------------------------------------------------------------- paragraphs and blocks


def join_lines(lines: list[str]) -> str:
    """Join wrapped lines with spaces; a hyphen at a line end before a lowercase letter is
    a hyphenated word and is removed."""
    parts: list[str] = []
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        if parts and parts[-1].endswith("\u00ad"):
            parts[-1] = parts[-1][:-1] + line
        elif (
            parts
            and len(parts[-1]) > 1
            and parts[-1][-1] == "-"
            and parts[-1][-2].isalpha()
            and line[0].islower()
        ):
            stem = parts[-1][:-1].rsplit(" ", 1)[-1]
            keep_hyphen = stem.isupper() or stem.lower() in _COMPOUND_PREFIXES
            parts[-1] = (parts[-1] if keep_hyphen else parts[-1][:-1]) + line
        else:
            parts.append(line)
    return " ".join(parts)


def _starts_item(text: str) -> bool:
    return bool(_BULLET.match(text) or _NUMBERED.match(text))


def _breaks_paragraph(current: list[_Line], line: _Line) -> bool:
    prev = current[-1]
    if (prev.band, prev.column) != (line.band, line.column) or _starts_item(line.text):
        return True
    height = max(prev.bottom - prev.top, 1.0)
    gap = line.top - prev.bottom
    if gap > 0.7 * height or gap < -0.5 * height:
        return True
    if abs(line.size - prev.size) > 0.15 * max(line.size, prev.size):
        return True
    if (
        prev.words
        and line.words
        and prev.words[0].bold != line.words[0].bold
        and all(w.bold for w in prev.words)
    ):
        return True
    indented = line.x0 > prev.x0 + 0.5 * height and not _starts_item(current[0].text)
    return indented and len(current) > 1


def _paragraph(lines: list[_Line], page: int) -> _Paragraph:
    text = join_lines([line.text for line in lines])
    kind = BlockKind.LIST_ITEM if _starts_item(text) else BlockKind.PARAGRAPH
    if _BULLET.match(text):
        text = "- " + _BULLET.sub("", text, count=1)
    sizes = [w.size for line in lines for w in line.words]
    bold = all(w.bold for line in lines for w in line.words)
    return _Paragraph(kind, text, page, statistics.median(sizes), bold, len(lines))


def page_paragraphs(page: _Page) -> list[_Paragraph]:
    out: list[_Paragraph] = []
    current: list[_Line] = []
    for line in order_lines(page):
        if line.table is not None:
            if current:
                out.append(_paragraph(current, page.number))
                current = []
            text, header, caption = line.table
            if caption:
                out.append(_Paragraph(BlockKind.PARAGRAPH, caption, page.number))
            out.append(_Paragraph(BlockKind.TABLE, text, page.number, table_header=header))
            continue
        if current and _breaks_paragraph(current, line):
            out.append(_paragraph(current, page.number))
            current = []
        current.append(line)
    if current:
        out.append(_paragraph(current, page.number))
    return out


def _body_size(paragraphs: list[_Paragraph]) -> float:
    weights: Counter[float] = Counter()
    for p in paragraphs:
        if p.kind is not BlockKind.TABLE and p.size:
            weights[round(p.size * 2) / 2] += len(p.text)
    return weights.most_common(1)[0][0] if weights else 0.0


def _heading_kind(p: _Paragraph, body: float) -> str:
    """'size', 'bold' or '' for a paragraph that looks like a heading."""
    text = p.text
    if p.kind is not BlockKind.PARAGRAPH or not body or p.lines > 3 or not 2 <= len(text) <= 200:
        return ""
    if text.endswith((".", ",", ";")) or sum(c.isalpha() for c in text) < 0.5 * len(text.replace(" ", "")):
        return ""
    if p.size >= 1.15 * body:
        return "size"
    return "bold" if p.bold and p.lines <= 2 and len(text) <= 120 and p.size >= 0.95 * body else ""


def _continue_tables(paragraphs: list[_Paragraph]) -> None:
    """A table that goes on at the top of the next page gets the header it had before."""
    for prev, cur in zip(paragraphs, paragraphs[1:], strict=False):
        if prev.kind is not BlockKind.TABLE or cur.kind is not BlockKind.TABLE or cur.page != prev.page + 1:
            continue
        if (
            prev.table_header.count("---") != cur.table_header.count("---")
            or cur.table_header == prev.table_header
        ):
            continue
        first_row = cur.table_header.split("\n")[0]
        body = cur.text.split("\n")[2:]
        cur.text = "\n".join([prev.table_header, first_row, *body])
        cur.table_header = prev.table_header


def build_blocks(paragraphs: list[_Paragraph]) -> list[Block]:
    """Blocks with heading levels (by font size rank, bold-only last) and section paths."""
    _continue_tables(paragraphs)
    body = _body_size(paragraphs)
    kinds = [_heading_kind(p, body) for p in paragraphs]
    sizes = sorted(
        {round(p.size * 2) / 2 for p, k in zip(paragraphs, kinds, strict=True) if k == "size"}, reverse=True
    )
    rank = {size: min(i + 1, 5) for i, size in enumerate(sizes)}
    sections = SectionTracker()
    blocks: list[Block] = []
    for p, kind in zip(paragraphs, kinds, strict=True):
        if kind:
            level = rank[round(p.size * 2) / 2] if kind == "size" else min(len(rank) + 1, 6)
            path = sections.enter(level, p.text)
            blocks.append(Block(BlockKind.HEADING, p.text, page=p.page, section_path=path, level=level))
        else:
            level = 0
            blocks.append(
                Block(
                    p.kind,
                    p.text,
                    page=p.page,
                    section_path=sections.path,
                    level=level,
                    table_header=p.table_header,
                )
            )
    return blocks


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
            pdf.close()
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

    def _read_pages(self, pdf: Any) -> tuple[list[_Page], DocumentMetadata]:
        try:
            page_objects = pdf.pages
            metadata = _pdf_metadata(pdf.metadata, len(page_objects))
        except Exception as exc:  # broken page tree / trailer
            raise DocumentParseError(f"cannot read the PDF pages: {type(exc).__name__}: {exc}") from exc
        if len(page_objects) > self.limits.max_pages:
            raise LimitExceededError(f"the PDF has {len(page_objects)} pages (limit {self.limits.max_pages})")
        deadline = time.monotonic() + self.limits.max_seconds
        pages: list[_Page] = []
        for number, page in enumerate(page_objects, start=1):
            try:
                pages.append(_read_page(page, number))
            except RagrpcError:
                raise
            except Exception as exc:  # one broken page must not lose the document
                logger.warning("PDF page %s unreadable: %s: %s", number, type(exc).__name__, exc)
                pages.append(_Page(number, 0.0, 0.0, without_text=True))
            finally:
                page.close()
            if time.monotonic() > deadline:
                raise LimitExceededError(f"PDF extraction took longer than {self.limits.max_seconds:.0f} s")
        return pages, metadata
