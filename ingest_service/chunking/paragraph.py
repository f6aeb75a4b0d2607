"""Whole paragraphs (blocks, or blank-line separated parts of a prose block) packed up to
chunk_size; an over-long paragraph is chunked on its own, by sentences, then tokens."""

from __future__ import annotations

from collections.abc import Sequence

from ingest_service.chunking.base import DocumentView, Draft, Piece, PlannedChunker
from ingest_service.chunking.units import (
    PROSE_LEVELS,
    Limits,
    levels_for,
    pack_drafts,
    paragraph_ranges,
    split_range,
)


class ParagraphChunker(PlannedChunker):
    """A chunk is either several whole paragraphs or a run of sentences of one paragraph."""

    name = "paragraph"

    def plan(self, view: DocumentView, blocks: Sequence[int]) -> list[Draft]:
        limits = Limits(self.config.chunk_size, self.config.max_tokens)
        drafts: list[Draft] = []
        run: list[Piece] = []
        for index in blocks:
            for paragraph in self._paragraphs(view, index):
                if paragraph.tokens <= limits.size:
                    run.append(paragraph)
                    continue
                drafts += self._pack(view, run, limits)
                run = []
                drafts += self._pack(view, self._split_long(view, index, paragraph, limits), limits)
        return drafts + self._pack(view, run, limits)

    def _pack(self, view: DocumentView, pieces: list[Piece], limits: Limits) -> list[Draft]:
        return pack_drafts(view, pieces, limits, self.name, min_tokens=self.config.min_chunk_tokens)

    @staticmethod
    def _paragraphs(view: DocumentView, index: int) -> list[Piece]:
        span = view.block_span(index)
        if levels_for(view.blocks[index].kind) is not PROSE_LEVELS:
            return [view.piece(*span)]  # code and tables: the whole block is the paragraph
        return [view.piece(a, b) for a, b in paragraph_ranges(view.text, *span)]

    @staticmethod
    def _split_long(view: DocumentView, index: int, paragraph: Piece, limits: Limits) -> list[Piece]:
        levels = levels_for(view.blocks[index].kind)
        finer = levels[1:] if levels is PROSE_LEVELS else levels
        return split_range(view, (paragraph.start, paragraph.end), finer, limits)
