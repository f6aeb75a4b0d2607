"""Semantic chunking: embed every sentence, start a new chunk where the similarity of
adjacent sentences drops (below a fixed cosine threshold, or below a percentile of this
document's similarities), and never exceed chunk_size."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from itertools import pairwise

import numpy as np

from ingest_service.chunking.base import ChunkingConfig, DocumentView, Draft, Piece, PlannedChunker
from ingest_service.chunking.units import Limits, pack_drafts, split_blocks
from ragrpc.tokens import TokenCounter

logger = logging.getLogger(__name__)

EmbedFunction = Callable[[list[str]], np.ndarray]


class SemanticChunker(PlannedChunker):
    """`embed` maps texts to one row each (L2-normalised; normalised again here anyway)."""

    name = "semantic"

    def __init__(self, counter: TokenCounter, config: ChunkingConfig | None = None, *, embed: EmbedFunction) -> None:
        super().__init__(counter, config)
        self._embed = embed

    def plan(self, view: DocumentView, blocks: Sequence[int]) -> list[Draft]:
        config = self.config
        limits = Limits(config.chunk_size, config.max_tokens)
        sentences = split_blocks(view, blocks, limits, to_sentences=True)
        bounds = self._topic_bounds(view, sentences)
        drafts: list[Draft] = []
        for first, stop in pairwise(bounds):
            drafts += pack_drafts(view, sentences[first:stop], limits, self.name, min_tokens=config.min_chunk_tokens)
        return drafts

    def similarities(self, texts: list[str]) -> np.ndarray:
        """Cosine similarity of each text with the next one (length len(texts) - 1)."""
        vectors = np.asarray(self._embed(texts), dtype=np.float64)
        if vectors.shape[0] != len(texts):
            raise ValueError(f"embed returned {vectors.shape[0]} rows for {len(texts)} texts")
        vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return np.einsum("ij,ij->i", vectors[:-1], vectors[1:])

    def _topic_bounds(self, view: DocumentView, sentences: list[Piece]) -> list[int]:
        """Sentence indexes where topics start, with 0 and len(sentences) at the ends."""
        if len(sentences) < 2:
            return [0, len(sentences)]
        similarity = self.similarities([view.text[p.start : p.end] for p in sentences])
        percentile = self.config.semantic_percentile
        if percentile is None:
            threshold = self.config.semantic_threshold
        else:
            threshold = float(np.percentile(similarity, percentile))
        starts = [int(i) + 1 for i in np.flatnonzero(similarity < threshold)]
        bounds = _merge_small_topics([0, *starts, len(sentences)], sentences, self.config.min_chunk_tokens)
        logger.debug("semantic: %d sentences, %d topic breaks", len(sentences), len(bounds) - 2)
        return bounds


def _merge_small_topics(bounds: list[int], sentences: list[Piece], min_tokens: int) -> list[int]:
    """Drops topic breaks that would leave a topic under min_tokens: a small topic joins
    the next one, a small last topic the one before it."""
    kept = [bounds[0]]
    for stop in bounds[1:-1]:
        if sum(p.tokens for p in sentences[kept[-1] : stop]) >= min_tokens:
            kept.append(stop)
    kept.append(bounds[-1])
    if len(kept) > 2 and sum(p.tokens for p in sentences[kept[-2] : kept[-1]]) < min_tokens:
        del kept[-2]
    return kept
