"""Chooses and runs the chunker for a request (strategy and sizes), with the embedding model's
tokenizer and its hard token limit, and enforces the per-document chunk limit
(RAGRPC_MAX_CHUNKS_PER_DOCUMENT): what one document may cost.

The limit is checked right after chunking, before anything is embedded or written, so a document
over it is refused with nothing of it stored (a replacement leaves the previous version ACTIVE).
The count is of stored rows: every draft, retrievable and PARENT alike (a hierarchical plan stores
both; only retrievable ones are embedded, but parents are written too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ingest_service.chunking import build_chunker
from ingest_service.chunking.base import ChunkingConfig
from ragrpc import errors
from ragrpc.models import ChunkDraft, ChunkKind, ExtractedDocument
from ragrpc.tokens import TokenCounter

CHUNK_LIMIT_SETTING = "RAGRPC_MAX_CHUNKS_PER_DOCUMENT"
TOO_MANY_CHUNKS = "TOO_MANY_CHUNKS"


class ChunkPlannerImpl:
    """ChunkPlanner over the chunker registry."""

    def __init__(
        self,
        counter: TokenCounter,
        max_tokens: int,
        *,
        default_size: int,
        default_overlap: int,
        max_chunks_per_document: int,
        embed: Callable[[list[str]], np.ndarray] | None = None,
    ) -> None:
        self._counter = counter
        self._max_chunks = checked_chunk_limit(max_chunks_per_document)
        self._embed = embed
        self._base = ChunkingConfig(
            chunk_size=min(default_size, max_tokens),
            overlap=min(default_overlap, max(0, min(default_size, max_tokens) - 1)),
            max_tokens=max_tokens,
        )

    def plan(self, document: ExtractedDocument, strategy: str, size: int, overlap: int) -> list[ChunkDraft]:
        config = self._base
        if size:
            if size > config.max_tokens:
                raise errors.InvalidInputError(
                    f"chunk_size_tokens {size} exceeds the embedding model's limit of {config.max_tokens} tokens",
                    field="spec.chunking.chunk_size_tokens",
                )
            config = replace(config, chunk_size=size, overlap=None if not overlap else overlap)
        elif overlap:
            config = replace(config, overlap=overlap)
        chunker = build_chunker(strategy or "auto", self._counter, config, embed=self._embed)
        drafts = chunker.chunk(document)
        enforce_chunk_limit(drafts, self._max_chunks)
        return drafts


def checked_chunk_limit(limit: int) -> int:
    """`limit` when it is a usable limit; there is no "unlimited" value, 0 or less is a configuration error."""
    if limit < 1:
        raise ValueError(f"{CHUNK_LIMIT_SETTING} must be at least 1 (got {limit}); there is no unlimited setting")
    return limit


def enforce_chunk_limit(drafts: list[ChunkDraft], limit: int) -> None:
    """Raises LimitExceededError (RESOURCE_EXHAUSTED, reason TOO_MANY_CHUNKS) when `drafts` would
    store more than `limit` chunk rows."""
    count = len(drafts)
    if count <= limit:
        return
    parents = sum(1 for d in drafts if d.kind == ChunkKind.PARENT)
    detail = f" ({count - parents} retrievable + {parents} parent)" if parents else ""
    raise errors.LimitExceededError(
        f"the document would be stored as {count} chunks{detail}, more than the limit of {limit} per document "
        f"({CHUNK_LIMIT_SETTING}); nothing of it was stored: split the document or ingest it with larger chunks",
        reason=TOO_MANY_CHUNKS,
        metadata={"setting": CHUNK_LIMIT_SETTING, "limit": str(limit), "chunk_count": str(count)},
    )
