"""What the in-process indexes (BM25, dense vectors) share on the way out: the filter applied to
each candidate's held attributes, and the ids and scores that pass turned into hits that carry
only their hit fields (the final hits' rows are read from the store by the retrieval pipeline)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ragrpc.models import ScoredChunk, StageScores
from ragrpc.store.filters import FilterExpr
from ragrpc.store.milvus_chunks import hit_to_chunk


class HeldFilter:
    """`expr` as an index's `allow` predicate, remembering the attributes of what it let through."""

    def __init__(self, expr: FilterExpr) -> None:
        self._expr = expr
        self._passed: dict[str, Mapping[str, Any]] = {}

    def __call__(self, attrs: Mapping[str, Any]) -> bool:
        if self._expr.matches(attrs):
            self._passed[attrs["chunk_id"]] = attrs
            return True
        return False

    def hits(self, found: list[tuple[str, float]], scores: Callable[[float], StageScores]) -> list[ScoredChunk]:
        """The hits of `found` ((chunk id, score) that passed), with the stage scores `scores` makes."""
        return [
            ScoredChunk(hit_to_chunk(self._passed[chunk_id]), float(score), scores(float(score)), complete=False)
            for chunk_id, score in found
        ]
