"""Sparse (BM25) retrievers behind the SparseRetriever protocol of retrieval.py."""

from __future__ import annotations

from query_service.sparse_index import InProcessBm25Index
from ragrpc.models import ScoredChunk, StageScores
from ragrpc.store.base import ChunkStore
from ragrpc.store.filters import FilterExpr
from ragrpc.store.milvus_chunks import hit_to_chunk


class MilvusBm25Retriever:
    """Milvus' built-in BM25 function (server-side; what a Milvus cluster uses). Its
    analyzer is `standard` (lowercase, no stop words, no stemming); IDF is per segment."""

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
        hits: list[ScoredChunk] = []
        rows: dict[str, dict] = {}

        def allow(attrs) -> bool:  # type: ignore[no-untyped-def]
            if expr.matches(attrs):
                rows[attrs["chunk_id"]] = attrs
                return True
            return False

        for chunk_id, score in self._index.search(query, limit, tenant=tenant, allow=allow, document_ids=document_ids):
            chunk = hit_to_chunk(rows[chunk_id])  # the index keeps no text: the final hits' rows are read
            hits.append(
                ScoredChunk(chunk=chunk, score=float(score), scores=StageScores(sparse=float(score)), complete=False)
            )
        return hits
