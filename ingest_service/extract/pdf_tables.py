"""PDF tables: pdfplumber's tables as positioned Markdown tables (cells filled with the
words whose centre they hold, stacked rows split, a one-cell first row taken as caption)."""

from __future__ import annotations

import bisect
from typing import Any

from ingest_service.extract.base import markdown_table
from ingest_service.extract.pdf_cleanup import join_lines
from ingest_service.extract.pdf_layout import Box, Line, Word, group_rows, turn_box


def _split_stacked_row(row: list[str]) -> list[list[str]]:
    """A row whose filled cells all hold the same number (>1) of lines is that many rows
    (tables ruled every few rows only, e.g. five states per ruled row)."""
    counts = {cell.count("\n") + 1 for cell in row if cell.strip()}
    filled = sum(1 for cell in row if cell.strip())
    if filled < 2 or len(counts) != 1 or (n := counts.pop()) < 2:
        return [row]
    return [[cell.split("\n")[k] if cell.strip() else "" for cell in row] for k in range(n)]


def _cell_words(cells: list[Box], words: list[Word]) -> list[list[list[Word]]]:
    """Words of each grid position (rows by cell top, columns by cell left edge); a word goes
    to the cell holding its centre, found through per-row buckets, not by scanning all cells."""
    tops = sorted({round(c[1], 1) for c in cells})
    lefts = sorted({round(c[0], 1) for c in cells})
    grid: list[list[list[Word]]] = [[[] for _ in lefts] for _ in tops]
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


def _cell_text(words: list[Word]) -> str:
    return "\n".join(" ".join(w.text for w in row) for row in group_rows(words))


def table_line(table: Any, words: list[Word], turn: str, size: tuple[float, float]) -> Line | None:
    """A pdfplumber table as a positioned Markdown table, or None if it is not a real table."""
    cells = [turn_box(tuple(float(v) for v in c), turn, *size) for c in table.cells]  # type: ignore[arg-type]
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
    x0, top, x1, bottom = turn_box(tuple(float(v) for v in table.bbox), turn, *size)  # type: ignore[arg-type]
    return Line(words=[], table=(text, header, caption), top=top, bottom=bottom, x0=x0, x1=x1)


def inside_any(word: Word, tables: list[Line]) -> bool:
    cx, cy = (word.x0 + word.x1) / 2, (word.top + word.bottom) / 2
    return any(t.x0 - 1 <= cx <= t.x1 + 1 and t.top - 1 <= cy <= t.bottom + 1 for t in tables)
