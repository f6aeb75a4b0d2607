"""HTML tables: the rows of a table (not of tables nested in its cells) as a grid of cell
texts, colspans padded, rowspans repeated, several header rows merged into one."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from bs4 import Tag

logger = logging.getLogger(__name__)


def table_rows(table: Tag) -> Iterator[tuple[Tag, bool]]:
    """(tr, in thead) for the rows of this table, not of tables nested in its cells."""
    for child in table.children:
        if not isinstance(child, Tag):
            continue
        if child.name == "tr":
            yield child, False
        elif child.name in ("thead", "tbody", "tfoot"):
            for row in child.children:
                if isinstance(row, Tag) and row.name == "tr":
                    yield row, child.name == "thead"


def table_grid(table: Tag, max_cells: int) -> tuple[list[list[str]], int]:
    """Rows of cell texts with colspan padded and rowspan repeated; also the header-row count."""
    grid: list[list[str]] = []
    pending: dict[int, tuple[int, str]] = {}  # column -> (rows left, text) from rowspans
    header_rows, cells = 0, 0
    for tr, in_head in table_rows(table):
        row: list[str] = []
        tds = [c for c in tr.children if isinstance(c, Tag) and c.name in ("td", "th")]
        all_th = bool(tds) and all(c.name == "th" for c in tds)
        if in_head or (len(grid) == header_rows and all_th and (not grid or len(tds) > 1)):
            header_rows += 1
        for td in tds:
            while len(row) in pending:
                _fill_pending(row, pending)
            text = td.get_text(" ", strip=True)
            span = int_attr(td, "colspan")
            for i in range(span):
                if int_attr(td, "rowspan") > 1:
                    pending[len(row)] = (int_attr(td, "rowspan") - 1, text)
                row.append(text if i == 0 else "")
        while len(row) in pending:
            _fill_pending(row, pending)
        grid.append(row)
        cells += len(row)
        if cells > max_cells:
            logger.warning("HTML table cut at %s rows (max_table_cells)", len(grid))
            break
    return grid, header_rows


def _fill_pending(row: list[str], pending: dict[int, tuple[int, str]]) -> None:
    left, text = pending.pop(len(row))
    if left > 1:
        pending[len(row)] = (left - 1, text)
    row.append(text)


def int_attr(tag: Tag, name: str) -> int:
    try:
        return max(1, min(int(str(tag.get(name) or 1)), 1000))
    except ValueError:
        return 1


def merge_header(grid: list[list[str]], header_rows: int) -> list[list[str]]:
    """Several header rows (pivot tables) become one: column-wise unique texts joined."""
    if header_rows <= 1:
        return grid
    width = max(len(r) for r in grid[:header_rows])
    merged = []
    for col in range(width):
        parts = [r[col] for r in grid[:header_rows] if col < len(r) and r[col]]
        merged.append(" / ".join(dict.fromkeys(parts)))
    return [merged, *grid[header_rows:]]
