"""Recursive splitting: blocks -> paragraphs -> sentences -> lines -> token windows, each
level applied only to what is still too long, then packed with overlap."""

from __future__ import annotations

from collections.abc import Sequence

from ingest_service.chunking.base import DocumentView, Draft, PlannedChunker
from ingest_service.chunking.units import Limits, pack_drafts, split_blocks


class RecursiveChunker(PlannedChunker):
    """The general-purpose strategy: keeps the largest structural units that fit; each chunk
    after the first starts with about `overlap` tokens (whole sentences when they fit)."""

    name = "recursive"

    def plan(self, view: DocumentView, blocks: Sequence[int]) -> list[Draft]:
        config = self.config
        limits = Limits(config.chunk_size, config.max_tokens)
        pieces = split_blocks(view, blocks, limits)
        return pack_drafts(view, pieces, limits, self.name, config.overlap_tokens, config.min_chunk_tokens)
