"""Chooses and runs the chunker for a request (strategy and sizes), with the embedding
model's tokenizer and its hard token limit, and refuses a plan over the per-document chunk
limit (see `chunk_limit`) before anything of it is embedded or stored."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ingest_service.chunk_limit import checked_chunk_limit, enforce_chunk_limit
from ingest_service.chunking import build_chunker
from ingest_service.chunking.base import ChunkingConfig
from ragrpc import errors
from ragrpc.models import ChunkDraft, ExtractedDocument
from ragrpc.tokens import TokenCounter


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
