"""Dense retrievers behind the DenseRetriever protocol of retrieval.py: the store's own vector
index (a Milvus server: HNSW, M 16, ef 128), or exact search over the vectors held in this
process (query_service.dense_index; where the store is milvus-lite, whose own search is slow).
`RAGRPC_DENSE_SEARCH` chooses (auto: in_process on milvus-lite, store elsewhere)."""

from __future__ import annotations

import numpy as np

from query_service.dense_index import InProcessDenseIndex
from query_service.held_hits import HeldFilter
from ragrpc import errors
from ragrpc.models import ScoredChunk, StageScores
from ragrpc.store.base import ChunkStore
from ragrpc.store.filters import FilterExpr

DENSE_SEARCH_MODES = ("auto", "store", "in_process")


def dense_search_mode(setting: str, chunks: ChunkStore) -> str:
    """`store` or `in_process` for RAGRPC_DENSE_SEARCH (auto: in_process where the store is embedded)."""
    mode = setting.strip().lower()
    if mode not in DENSE_SEARCH_MODES:
        raise errors.PreconditionError(f"unknown RAGRPC_DENSE_SEARCH {setting!r}; use {', '.join(DENSE_SEARCH_MODES)}")
    if mode == "auto":
        return "in_process" if chunks.embedded else "store"
    return mode


class StoreDenseRetriever:
    """The store's vector search; ids and visibility fields only (rows are read for the final hits)."""

    name = "store"

    def __init__(self, chunks: ChunkStore) -> None:
        self._chunks = chunks

    def search(
        self, vector: np.ndarray, tenant: str, expr: FilterExpr, limit: int, document_ids: list[str] | None = None
    ) -> list[ScoredChunk]:
        return self._chunks.search_dense(vector, expr, limit, False)


class InProcessDenseRetriever:
    """Exact search over the vectors the query service holds, kept in step with the shared
    collection by ChunkIndexSync (a search never waits for it)."""

    name = "in_process"

    def __init__(self, index: InProcessDenseIndex) -> None:
        self._index = index

    def search(
        self, vector: np.ndarray, tenant: str, expr: FilterExpr, limit: int, document_ids: list[str] | None = None
    ) -> list[ScoredChunk]:
        allow = HeldFilter(expr)
        found = self._index.search(vector, limit, tenant=tenant, allow=allow, document_ids=document_ids)
        return allow.hits(found, lambda score: StageScores(dense=score))
