"""Whole sentences packed up to chunk_size; only a sentence longer than max_tokens is cut
(by token windows)."""

from __future__ import annotations

from collections.abc import Sequence

from ingest_service.chunking.base import DocumentView, Draft, PlannedChunker
from ingest_service.chunking.units import Limits, pack_drafts, split_blocks


class SentenceChunker(PlannedChunker):
    """Sentences (lines for code and tables) packed greedily, never across a sentence."""

    name = "sentence"

    def plan(self, view: DocumentView, blocks: Sequence[int]) -> list[Draft]:
        limits = Limits(self.config.chunk_size, self.config.max_tokens)
        sentences = split_blocks(view, blocks, limits, to_sentences=True)
        return pack_drafts(view, sentences, limits, self.name, min_tokens=self.config.min_chunk_tokens)
