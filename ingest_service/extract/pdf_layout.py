"""PDF page geometry: positioned words and lines, rows, vertical gutters between text
columns and the reading order of a page (spanning rows in place, the others column by
column within their band)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Word:
    x0: float
    x1: float
    top: float
    bottom: float
    text: str
    size: float
    bold: bool


@dataclass(slots=True)
class Line:
    """One row (or one column's part of a row) in reading order; or a table."""

    words: list[Word]
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
class Page:
    number: int
    width: float
    height: float
    rows: list[list[Word]] = field(default_factory=list)
    tables: list[Line] = field(default_factory=list)
    without_text: bool = False
    image_page: bool = False


Box = tuple[float, float, float, float]  # x0, top, x1, bottom


def turn_box(box: Box, turn: str, width: float, height: float) -> Box:
    """A box of a page whose text runs vertically, in the coordinates of the page turned upright."""
    x0, top, x1, bottom = box
    if turn == "ttb":
        return top, width - x1, bottom, width - x0
    if turn == "btt":
        return height - bottom, x0, height - top, x1
    return box


def to_word(w: dict[str, Any], turn: str, size: tuple[float, float]) -> Word:
    font = str(w.get("fontname", "")).lower()
    x0, top, x1, bottom = turn_box((float(w["x0"]), float(w["top"]), float(w["x1"]), float(w["bottom"])), turn, *size)
    return Word(
        x0,
        x1,
        top,
        bottom,
        str(w["text"]),
        float(w.get("size") or (bottom - top)),
        any(k in font for k in ("bold", "black", "heavy", "semibold")),
    )


def group_rows(words: list[Word]) -> list[list[Word]]:
    """Words of one visual line together: sorted by top, a word joins the current row when
    it overlaps the row's first word vertically by at least half a height."""
    rows: list[list[Word]] = []
    ref: Word | None = None
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


# ---------------------------------------------------------------- columns and reading order


def _phrases(row: list[Word], max_gap_em: float = 0.6) -> list[tuple[float, float]]:
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


def _coverage(rows: list[list[Word]], width: int) -> list[int]:
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


def _low_runs(coverage: list[int], left: int, right: int, limit: float, min_width: int) -> list[tuple[int, int]]:
    runs, start = [], None
    for x in range(left, right + 1):
        if coverage[x] <= limit and x < right:
            start = x if start is None else start
        elif start is not None:
            if x - start >= min_width:
                runs.append((start, x))
            start = None
    return runs


def find_gutters(rows: list[list[Word]], page_width: float) -> list[tuple[float, float]]:
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
    rows: list[list[Word]], gutters: list[tuple[float, float]], left: float, right: float
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
        wide_enough = col_end - col_start >= 0.18 * (right - left) and right - gutter[1] >= 0.18 * (right - left)
        edge = max(ends, default=col_start)
        filled = sum(1 for e in ends if e >= edge - 0.2 * (col_end - col_start))
        if wide_enough and len(ends) >= 4 and filled >= 0.5 * len(ends):
            kept.append(gutter)
            col_start = gutter[1]
    return kept


def order_lines(page: Page) -> list[Line]:
    """Rows and tables in reading order: spanning rows in place, others column by column."""
    gutters = find_gutters(page.rows, page.width)
    centers = [(a + b) / 2 for a, b in gutters]
    items: list[tuple[float, list[Word] | Line]] = [(row[0].top, row) for row in page.rows]
    items += [(t.top, t) for t in page.tables]
    items.sort(key=lambda item: item[0])
    ordered: list[Line] = []
    band: list[Line] = []
    band_id = 0

    def flush() -> None:
        nonlocal band_id
        ordered.extend(sorted(band, key=lambda line: (line.column, line.top)))
        band.clear()
        band_id += 1

    for _, item in items:
        spans = [(item.x0, item.x1)] if isinstance(item, Line) else _phrases(item, 0.45)
        if any(a < c < b for a, b in spans for c in centers):
            flush()
            line = item if isinstance(item, Line) else Line(item)
            line.band, line.column = band_id, -1
            ordered.append(line)
            band_id += 1
            continue
        band.extend(_split_by_columns(item, centers, band_id))
    flush()
    return ordered


def _split_by_columns(item: list[Word] | Line, centers: list[float], band_id: int) -> list[Line]:
    def column_of(x: float) -> int:
        return sum(1 for c in centers if x > c)

    if isinstance(item, Line):
        item.band, item.column = band_id, column_of((item.x0 + item.x1) / 2)
        return [item]
    parts: dict[int, list[Word]] = {}
    for word in item:
        parts.setdefault(column_of((word.x0 + word.x1) / 2), []).append(word)
    return [Line(words, column=col, band=band_id) for col, words in parts.items()]
