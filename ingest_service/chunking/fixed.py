"""Fixed-size token windows with overlap over the whole text, cut on token boundaries."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ingest_service.chunking.base import DocumentView, Draft, PlannedChunker

logger = logging.getLogger(__name__)


class FixedTokenChunker(PlannedChunker):
    """Windows of chunk_size tokens; consecutive windows share about `overlap` tokens. A
    window ends at whitespace when one is near the cut, so words stay whole; a tiny last
    remainder (< min_chunk_tokens) joins the window before it."""

    name = "fixed_tokens"

    def plan(self, view: DocumentView, blocks: Sequence[int]) -> list[Draft]:
        config = self.config
        start, end = view.block_span(blocks[0])[0], view.block_span(blocks[-1])[1]
        windows = view.tokens.windows(
            start,
            end,
            config.chunk_size,
            config.overlap_tokens,
            absorb=config.min_chunk_tokens,
            limit=config.max_tokens,
        )
        drafts: list[Draft] = []
        previous_end = start
        for window_start, window_end in windows:
            anchor = _next_visible(view.text, max(window_start, previous_end), window_end)
            drafts.append(Draft([(window_start, window_end)], self.name, anchor))
            previous_end = window_end
        return drafts


def _next_visible(text: str, offset: int, limit: int) -> int:
    """First non-whitespace offset at or after `offset` (the chunk's own new text)."""
    while offset < limit and text[offset].isspace():
        offset += 1
    return offset
