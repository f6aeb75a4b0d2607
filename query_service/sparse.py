"""Sparse (BM25) retrievers behind the SparseRetriever protocol of retrieval.py."""

from __future__ import annotations

from query_service.chunk_attrs import HeldFilter
from query_service.sparse_index import InProcessBm25Index
from ragrpc.models import ScoredChunk, StageScores
from ragrpc.store.base import ChunkStore
from ragrpc.store.filters import FilterExpr


class MilvusBm25Retriever:
    """Milvus' built-in BM25 function (server-side; what a Milvus cluster uses). In collections of
    schema 2 it scores the terms of ragrpc's English analyzer over each chunk's context header and
    text (ragrpc.store.bm25_text: stop words, stems, as rank_bm25); in older ones the raw text with
    Milvus' `standard` analyzer. Its statistics are Milvus' own (per segment on milvus-lite)."""

    name = "milvus_bm25"

    def __init__(self, chunks: ChunkStore) -> None:
        self._chunks = chunks

    def search(
        self, query: str, tenant: str, expr: FilterExpr, limit: int, document_ids: list[str] | None = None
    ) -> list[ScoredChunk]:
        return self._chunks.search_bm25(query, expr, limit)


class RankBm25Retriever:
    """BM25 (rank_bm25's Okapi formula) in this process with an English analyzer (stop
    words, Snowball stemming) and per-tenant global statistics, kept in step with the
    shared collection in the background by ChunkIndexSync (a search never waits for it)."""

    name = "rank_bm25"

    def __init__(self, index: InProcessBm25Index) -> None:
        self._index = index

    def search(
        self, query: str, tenant: str, expr: FilterExpr, limit: int, document_ids: list[str] | None = None
    ) -> list[ScoredChunk]:
        allow = HeldFilter(expr)
        found = self._index.search(query, limit, tenant=tenant, allow=allow, document_ids=document_ids)
        return allow.hits(found, lambda score: StageScores(sparse=score))
