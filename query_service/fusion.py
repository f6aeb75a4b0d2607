"""Fusion of the dense and the sparse candidate lists into one ranking.

Both fusers take the lists best first (as the retrievers return them), use each hit's
`score` as its stage score, and return new ScoredChunks with StageScores(dense, sparse,
fused) filled (None where a list did not contain the chunk) and `score` = fused score,
sorted by fused score descending, ties broken by chunk_id. A chunk_id repeated within a
list counts once, at its best rank. Inputs are not modified. With `limit`, only the best `limit`
are returned (every candidate is scored and ranked; only the head is built: a query shows its
top-k, so the ~200 candidates of a hybrid query need not all become result objects).
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ragrpc.errors import InvalidInputError
from ragrpc.models import ScoredChunk, StageScores

logger = logging.getLogger(__name__)


class Fusion(Protocol):
    """Merges a dense and a sparse ranking."""

    def fuse(
        self, dense: Sequence[ScoredChunk], sparse: Sequence[ScoredChunk], limit: int | None = None
    ) -> list[ScoredChunk]: ...


@dataclass
class _Entry:
    hit: ScoredChunk
    dense_rank: int | None = None
    dense: float | None = None
    sparse_rank: int | None = None
    sparse: float | None = None


def _merge(dense: Sequence[ScoredChunk], sparse: Sequence[ScoredChunk]) -> dict[str, _Entry]:
    """chunk_id -> its (1-based) rank and score in each list; the dense hit's chunk wins unless only
    its hit fields were read and the sparse hit's row is complete."""
    entries: dict[str, _Entry] = {}
    for rank, hit in enumerate(dense, 1):
        entry = entries.setdefault(hit.chunk.chunk_id, _Entry(hit))
        if entry.dense_rank is None:
            entry.dense_rank, entry.dense = rank, hit.score
    for rank, hit in enumerate(sparse, 1):
        entry = entries.setdefault(hit.chunk.chunk_id, _Entry(hit))
        if entry.sparse_rank is None:
            entry.sparse_rank, entry.sparse = rank, hit.score
        if hit.complete and not entry.hit.complete:
            entry.hit = hit
    return entries


def _ranked(entries: dict[str, _Entry], fused: dict[str, float], limit: int | None = None) -> list[ScoredChunk]:
    """The fused hits best first (score descending, then chunk_id); the best `limit` of them with a limit."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if limit is None or limit >= len(entries):
        order = sorted(entries, key=lambda chunk_id: (-fused[chunk_id], chunk_id))
    else:
        order = heapq.nsmallest(limit, entries, key=lambda chunk_id: (-fused[chunk_id], chunk_id))
    return [
        ScoredChunk(
            chunk=entries[chunk_id].hit.chunk,
            score=fused[chunk_id],
            scores=StageScores(
                dense=entries[chunk_id].dense,
                sparse=entries[chunk_id].sparse,
                fused=fused[chunk_id],
            ),
            complete=entries[chunk_id].hit.complete,
        )
        for chunk_id in order
    ]


class RrfFusion:
    """Reciprocal rank fusion: fused = sum over the lists containing the chunk of 1 / (k + rank)."""

    name = "rrf"

    def __init__(self, k: int = 20) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
            raise InvalidInputError(f"rrf_k must be a positive integer, got {k!r}", field="options.rrf_k")
        self.k = k

    def fuse(
        self, dense: Sequence[ScoredChunk], sparse: Sequence[ScoredChunk], limit: int | None = None
    ) -> list[ScoredChunk]:
        entries = _merge(dense, sparse)
        k = self.k
        fused = {
            chunk_id: (0.0 if e.dense_rank is None else 1.0 / (k + e.dense_rank))
            + (0.0 if e.sparse_rank is None else 1.0 / (k + e.sparse_rank))
            for chunk_id, e in entries.items()
        }
        return _ranked(entries, fused, limit)


def min_max_normalise(scores: Sequence[float]) -> list[float]:
    """Scale to [0, 1] by (s - min) / (max - min); one score or all-equal scores give 1.0."""
    if not scores:
        return []
    low, high = min(scores), max(scores)
    if high - low <= 0 or not math.isfinite(high - low):
        return [1.0] * len(scores)
    return [(score - low) / (high - low) for score in scores]


class WeightedFusion:
    """fused = dense_weight * normalised dense + sparse_weight * normalised sparse.

    Each list is min-max normalised on its own; a chunk missing from a list gets 0 there.
    """

    name = "weighted"

    def __init__(self, dense_weight: float = 0.5, sparse_weight: float = 0.5) -> None:
        for name, weight in (("dense_weight", dense_weight), ("sparse_weight", sparse_weight)):
            if (
                isinstance(weight, bool)
                or not isinstance(weight, int | float)
                or not math.isfinite(weight)
                or weight < 0
            ):
                raise InvalidInputError(f"{name} must be a finite number >= 0", field=f"options.{name}")
        if dense_weight + sparse_weight <= 0:
            raise InvalidInputError("dense_weight and sparse_weight are both 0", field="options.dense_weight")
        self.dense_weight = float(dense_weight)
        self.sparse_weight = float(sparse_weight)

    def fuse(
        self, dense: Sequence[ScoredChunk], sparse: Sequence[ScoredChunk], limit: int | None = None
    ) -> list[ScoredChunk]:
        entries = _merge(dense, sparse)
        dense_norm = _normalised_by_id(entries, "dense")
        sparse_norm = _normalised_by_id(entries, "sparse")
        fused = {
            chunk_id: self.dense_weight * dense_norm.get(chunk_id, 0.0)
            + self.sparse_weight * sparse_norm.get(chunk_id, 0.0)
            for chunk_id in entries
        }
        return _ranked(entries, fused, limit)


def _normalised_by_id(entries: dict[str, _Entry], stage: str) -> dict[str, float]:
    scores = {chunk_id: getattr(entry, stage) for chunk_id, entry in entries.items()}
    present = {chunk_id: score for chunk_id, score in scores.items() if score is not None}
    return dict(zip(present, min_max_normalise(list(present.values())), strict=True))
