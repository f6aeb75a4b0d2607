"""Tables: a TABLE block (a Markdown table) is one chunk when it fits in max_tokens. A larger
one is split between rows; every part after the first starts with the header row and a
compacted separator row ("|---|:---:|", as tokenizers count every dash); a single row too
long for a part is cut by tokens, still under the header. A wide table's header (over half a
chunk) is repeated with one-dash separators ("|-|:-:|") as long as it leaves room for a
typical row, so that every row is still retrieved with the header that names its columns."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ingest_service.chunking.base import DocumentView, Draft, Piece, PlannedChunker, Range
from ingest_service.chunking.units import (
    TABLE_LEVELS,
    Limits,
    line_ranges,
    pack,
    pack_drafts,
    split_blocks,
    split_range,
)
from ragrpc.models import BlockKind

_SEPARATOR_ROW = re.compile(r"\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*")
_DASHES = re.compile(r"-{4,}")
_ANY_DASHES = re.compile(r"-+")
_SPACES = re.compile(r"[ \t]+")


def table_header(view: DocumentView, index: int) -> tuple[Range, Range] | None:
    """The header row and separator row of TABLE block `index`: Block.table_header when
    the table starts with it, else the first two lines when the second is a separator."""
    start, end = view.block_span(index)
    lines = line_ranges(view.text, start, end)
    if len(lines) < 3:
        return None
    declared = view.blocks[index].table_header.strip()
    separator = view.text[lines[1][0] : lines[1][1]]
    if (declared and view.text.startswith(declared, start)) or _SEPARATOR_ROW.fullmatch(separator):
        return lines[0], lines[1]
    return None


def compact_header(view: DocumentView, header: tuple[Range, Range], minimal: bool = False) -> str:
    (row_start, row_end), (sep_start, sep_end) = header
    separator = _SPACES.sub("", _DASHES.sub("---", view.text[sep_start:sep_end]))
    if minimal:
        separator = _ANY_DASHES.sub("-", separator)
    return f"{view.text[row_start:row_end]}\n{separator}"


class TableChunker(PlannedChunker):
    """TABLE blocks as described above; other blocks are packed as paragraphs."""

    name = "table"

    def plan(self, view: DocumentView, blocks: Sequence[int]) -> list[Draft]:
        drafts: list[Draft] = []
        text_blocks: list[int] = []
        for index in blocks:
            if view.blocks[index].kind is BlockKind.TABLE:
                drafts += self._text(view, text_blocks) + self.plan_table(view, index)
                text_blocks = []
            else:
                text_blocks.append(index)
        return drafts + self._text(view, text_blocks)

    def _limits(self, reserved: int = 0) -> Limits:
        return Limits(self.config.chunk_size - reserved, self.config.max_tokens - reserved)

    def _text(self, view: DocumentView, blocks: list[int]) -> list[Draft]:
        pieces = split_blocks(view, blocks, self._limits())
        return pack_drafts(view, pieces, self._limits(), self.name, min_tokens=self.config.min_chunk_tokens)

    def plan_table(self, view: DocumentView, index: int) -> list[Draft]:
        start, end = view.block_span(index)
        if view.count(start, end) <= self.config.max_tokens:
            return [Draft([(start, end)], self.name, start)]
        header = table_header(view, index)
        repeated = self._repeated_header(view, header, end) if header else ""
        if header is None or not repeated:
            pieces = split_range(view, (start, end), TABLE_LEVELS, self._limits())
            return pack_drafts(view, pieces, self._limits(), self.name)
        limits = self._limits(self.counter.count(repeated))
        rows = [
            piece
            for row in line_ranges(view.text, header[1][1], end)
            for piece in split_range(view, row, (), limits, atomic=True)
        ]
        first = self._first_rows(rows, view.count(start, header[1][1]))
        # No row fits under the table's own (uncompacted) header: every part gets the repeated one.
        drafts = [Draft([(start, rows[first - 1].end)], self.name, start)] if first else []
        for group in pack(view, rows[first:], limits, min_tokens=self.config.min_chunk_tokens):
            drafts.append(Draft([(group.pieces[0].start, group.pieces[-1].end)], self.name, start, prefix=repeated))
        return drafts

    def _repeated_header(self, view: DocumentView, header: tuple[Range, Range], end: int) -> str:
        """The header to put on top of every part after the first; "" when it is too long to repeat."""
        repeated = compact_header(view, header)
        if self.counter.count(repeated) <= self.config.chunk_size // 2:
            return repeated
        minimal = compact_header(view, header, minimal=True)
        rows = sorted(view.count(a, b) for a, b in line_ranges(view.text, header[1][1], end))
        typical = rows[len(rows) // 2] if rows else 0  # a longer row (a footnote) is cut under the header
        return minimal if self.counter.count(minimal) + typical < self.config.max_tokens else ""

    def _first_rows(self, rows: list[Piece], header_tokens: int) -> int:
        """How many rows go into the first part, under the table's own header."""
        budget, total, count = self._limits(header_tokens), 0, 0
        for row in rows:
            if count and total + row.tokens > budget.size:
                break
            if row.tokens > budget.hard:
                break
            total, count = total + row.tokens, count + 1
        return count
