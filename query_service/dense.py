"""Dense retrievers behind the DenseRetriever protocol of retrieval.py: the store's own vector
index (a Milvus server: HNSW, M 16, ef 192), or exact search over the vectors held in this
process (query_service.dense_index). `RAGRPC_DENSE_SEARCH` chooses; auto holds the vectors where
that is faster than asking the store (`make bench`, scale section, 2 cores):

  * milvus-lite, at any size: its own search costs 17 ms at 10k chunks and 113 ms at 100k, exact
    search over the same vectors in memory 0.4 and 7 ms;
  * a Milvus server, while the collection holds at most RAGRPC_DENSE_IN_PROCESS_MAX_CHUNKS chunks
    (50k) at start: below that, exact search in memory (under 3 ms, 75 MB) beats a round trip to
    the server's HNSW index (8-9 ms at 10k) and its recall (0.93-0.96 at 10k); above it, the
    server's index scales and the query service holds no vectors;
  * never over the in-memory test store, whose own search is exact numpy in this process.

Held vectors follow the collection with the registry follower's polls (as the rank_bm25 index
does); the choice is made once, at start."""

from __future__ import annotations

import logging

import numpy as np

from query_service.chunk_attrs import HeldFilter
from query_service.dense_index import InProcessDenseIndex
from ragrpc import errors
from ragrpc.models import ScoredChunk, StageScores
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.store.base import ChunkStore
from ragrpc.store.filters import FilterExpr

logger = logging.getLogger(__name__)

DENSE_SEARCH_MODES = ("auto", "store", "in_process")


def dense_search_mode(setting: str, chunks: ChunkStore, in_process_max_chunks: int = 0) -> str:
    """`store` or `in_process` for RAGRPC_DENSE_SEARCH (auto: see the module docstring; on a Milvus
    server this counts the collection's chunks, one store call)."""
    mode = setting.strip().lower()
    if mode not in DENSE_SEARCH_MODES:
        raise errors.PreconditionError(f"unknown RAGRPC_DENSE_SEARCH {setting!r}; use {', '.join(DENSE_SEARCH_MODES)}")
    if in_process_max_chunks < 0:
        raise errors.PreconditionError(
            f"RAGRPC_DENSE_IN_PROCESS_MAX_CHUNKS must be 0 (never) or more, got {in_process_max_chunks}"
        )
    if mode != "auto":
        return mode
    if chunks.embedded:
        return "in_process"
    if chunks.searches_exactly_in_process or not in_process_max_chunks:
        return "store"
    count = chunks.count_chunks(f.gte(s.CHUNK_INDEX, 0))
    chosen = "in_process" if count <= in_process_max_chunks else "store"
    logger.info(
        "dense search auto: %s (%d chunks in the collection, RAGRPC_DENSE_IN_PROCESS_MAX_CHUNKS=%d)",
        chosen,
        count,
        in_process_max_chunks,
    )
    return chosen


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
