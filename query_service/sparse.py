"""Sparse (BM25) retrievers behind the SparseRetriever protocol of retrieval.py."""

from __future__ import annotations

from ragrpc.models import ScoredChunk
from ragrpc.store.base import ChunkStore
from ragrpc.store.filters import FilterExpr


class MilvusBm25Retriever:
    """Milvus' built-in BM25 function (server-side; what a Milvus cluster uses)."""

    name = "milvus_bm25"

    def __init__(self, chunks: ChunkStore) -> None:
        self._chunks = chunks

    def search(self, query: str, expr: FilterExpr, limit: int) -> list[ScoredChunk]:
        return self._chunks.search_bm25(query, expr, limit)
