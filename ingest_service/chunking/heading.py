"""One chunk per heading section, the heading text at the top of it; a section that is too
long is split recursively, its heading repeated at the top of every part."""

from __future__ import annotations

from collections.abc import Sequence

from ingest_service.chunking.base import DocumentView, Draft, PlannedChunker, Range
from ingest_service.chunking.units import (
    Limits,
    pack,
    pack_drafts,
    parts_tokens,
    split_blocks,
    split_sections,
)
from ragrpc.models import BlockKind


class HeadingChunker(PlannedChunker):
    """Headings with no text of their own ("## v2.1" right before "### Fixes") are stacked
    on top of the next section. Blocks given without their heading (a section continued
    after a code block, as AutoChunker passes them) get the section's heading repeated."""

    name = "heading"

    def plan(self, view: DocumentView, blocks: Sequence[int]) -> list[Draft]:
        drafts: list[Draft] = []
        stacked: list[int] = []
        for section in split_sections(view, blocks):
            body = [i for i in section if view.blocks[i].kind is not BlockKind.HEADING]
            headings = [i for i in section if view.blocks[i].kind is BlockKind.HEADING]
            if not body:
                stacked += headings
                continue
            if not headings and not stacked:
                headings = _heading_of(view, body[0])
            drafts += self._section(view, stacked + headings, body)
            stacked = []
        if stacked:  # headings with nothing after them
            limits = Limits(self.config.chunk_size, self.config.max_tokens)
            pieces = split_blocks(view, stacked, limits)
            drafts += pack_drafts(view, pieces, limits, self.name, min_tokens=self.config.min_chunk_tokens)
        return drafts

    def _section(self, view: DocumentView, headings: list[int], body: list[int]) -> list[Draft]:
        config = self.config
        header: list[Range] = [view.block_span(i) for i in headings]
        header_tokens = parts_tokens(view, header)
        if header_tokens > config.chunk_size // 2:
            if headings and headings[-1] + 1 == body[0]:
                body = headings + body  # a huge heading is text, not a header to repeat
            header, header_tokens = [], 0
        limits = Limits(config.chunk_size - header_tokens, config.max_tokens - header_tokens)
        pieces = split_blocks(view, body, limits)
        groups = pack(view, pieces, limits, min_tokens=config.min_chunk_tokens)
        header = _merge_adjacent(header)
        return [Draft([*header, (g.pieces[0].start, g.pieces[-1].end)], self.name, g.pieces[0].start) for g in groups]


def _heading_of(view: DocumentView, index: int) -> list[int]:
    """The heading block of the section block `index` sits in, if it precedes it."""
    path = view.blocks[index].section_path
    for k in range(index - 1, -1, -1):
        if view.blocks[k].kind is BlockKind.HEADING:
            return [k] if path and view.blocks[k].section_path == path else []
    return []


def _merge_adjacent(parts: list[Range]) -> list[Range]:
    """Stacked headings are consecutive blocks: one range keeps their original spacing."""
    return [(parts[0][0], parts[-1][1])] if parts else []
