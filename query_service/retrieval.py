"""The retrieval pipeline:

analyse the question (the configured enrichers' query side, ragrpc.enrich: extra BM25 terms, implied filters)
embed query -> dense top-N  |  sparse (BM25) top-N      (concurrently, off the event loop; the BM25 query
                                                        adds the analysis' terms)
  -> visibility (only chunks of the documents' current generation)
  -> fuse (RRF or weighted; or one list alone) -> rerank (local cross-encoder or remote API, when configured;
     a failed rerank keeps the fused order and the summary says why)
  -> diversify (MMR, when asked) -> min score, top-k -> parents (when asked)
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from query_service.consistency import ConsistencyGate
from query_service.dense import StoreDenseRetriever
from query_service.diversity import MmrDiversifier
from query_service.fusion import RrfFusion, WeightedFusion
from query_service.registry_follower import RegistryFollower
from query_service.rerank import Reranker, RerankUnavailableError
from query_service.retrieval_types import RetrievalQuery, RetrievalResult, StageTimer
from ragrpc import deadlines, errors
from ragrpc.consistency import is_visible
from ragrpc.embeddings import Embedder
from ragrpc.enrich import QueryAnalyser, QueryAnalysis
from ragrpc.models import ChunkRecord, ScoredChunk, document_key
from ragrpc.store.base import ChunkStore, DocumentRegistry
from ragrpc.store.filters import FilterExpr
from ragrpc.store.request_filter import filter_from_request, implied_conditions
from ragrpc.tracing import NoopTracer, Tracer, in_current_context

logger = logging.getLogger(__name__)


class SparseRetriever(Protocol):
    """BM25 search over the tenant's chunks matching `expr`."""

    name: str

    def search(
        self, query: str, tenant: str, expr: FilterExpr, limit: int, document_ids: list[str] | None = None
    ) -> list[ScoredChunk]: ...


class DenseRetriever(Protocol):
    """Vector search over the tenant's chunks matching `expr`: hits with their hit fields (complete=False)."""

    name: str

    def search(
        self, vector: np.ndarray, tenant: str, expr: FilterExpr, limit: int, document_ids: list[str] | None = None
    ) -> list[ScoredChunk]: ...


class Visibility(Protocol):
    """Which generations of each document a query may show: the visible one and, while a replacement
    is being applied, the new one too (oldest first)."""

    @property
    def ready(self) -> bool:
        """False while the start-up load runs: queries are refused (UNAVAILABLE) until then."""
        ...

    def accepted(self, seen: Mapping[str, Collection[str]]) -> dict[str, tuple[str, ...]]:
        """For the document keys of the hits (with the generations the hits carry), the generations a
        query may show of each visible document."""
        ...

    def accepted_in_memory(self, seen: Mapping[str, Collection[str]]) -> dict[str, tuple[str, ...]] | None:
        """`accepted(seen)` when it can be answered from memory without blocking (the query then
        needs no thread for it); None when it needs a store read (`accepted`, run in a thread)."""
        ...


class RegistryVisibility:
    """Visibility read from the registry (one grouped read by key)."""

    def __init__(self, registry: DocumentRegistry) -> None:
        self._registry = registry

    @property
    def ready(self) -> bool:
        return True

    def accepted_in_memory(self, seen: Mapping[str, Collection[str]]) -> dict[str, tuple[str, ...]] | None:
        return None

    def accepted(self, seen: Mapping[str, Collection[str]]) -> dict[str, tuple[str, ...]]:
        records = self._registry.get_many(list(seen))
        return {key: (r.generation,) for key, r in records.items() if is_visible(r)}


class FollowedVisibility:
    """Visibility from the registry follower's memory. The registry is read (one grouped read by key)
    only for hits the follower cannot place: documents it does not know yet (ingested since its last
    poll) and generations it does not know of a known document (replaced since its last poll). So a
    document is found by the store's dense search as soon as its ingestion or replacement is
    acknowledged (by the in-process indexes after the follower's next poll), and a query costs no
    store call once followed."""

    def __init__(self, followed: RegistryFollower, registry: DocumentRegistry) -> None:
        self._followed = followed
        self._registry = RegistryVisibility(registry)

    @property
    def ready(self) -> bool:
        return self._followed.ready

    def accepted_in_memory(self, seen: Mapping[str, Collection[str]]) -> dict[str, tuple[str, ...]] | None:
        known = self._followed.accepted(seen)
        return None if self._unplaced(seen, known) else known

    def _unplaced(
        self, seen: Mapping[str, Collection[str]], known: Mapping[str, tuple[str, ...]]
    ) -> dict[str, Collection[str]]:
        """The hits' documents and generations the follower cannot place (the registry must say)."""
        unplaced: dict[str, Collection[str]] = {}
        for key, generations in seen.items():
            accepted = known.get(key)
            if accepted is None:
                if not self._followed.knows(key):  # not seen by the follower yet
                    unplaced[key] = generations
            elif any(generation not in accepted for generation in generations):  # a generation it does not know
                unplaced[key] = generations
        return unplaced

    def accepted(self, seen: Mapping[str, Collection[str]]) -> dict[str, tuple[str, ...]]:
        known = self._followed.accepted(seen)
        unplaced = self._unplaced(seen, known)
        if unplaced:
            for key, (generation,) in self._registry.accepted(unplaced).items():
                known[key] = tuple(dict.fromkeys((*known.get(key, ()), generation)))
        return known


class RetrievalPipeline:
    def __init__(
        self,
        *,
        embedder: Embedder,
        chunks: ChunkStore,
        visibility: Visibility,
        dense: DenseRetriever | None = None,
        sparse: SparseRetriever | None,
        reranker: Reranker | None,
        executor: Executor,
        rerank_top_n: int = 30,
        clock: Callable[[], float] = time.perf_counter,
        tracer: Tracer | None = None,
        query_analyser: QueryAnalyser | None = None,
        consistency: ConsistencyGate | None = None,
        embed_executor: Executor | None = None,
        dense_executor: Executor | None = None,
    ) -> None:
        self._consistency = consistency  # read your writes (None: tokens are not waited for)
        # query embedding runs apart from the search threads (`executor`)
        self._embed_executor = embed_executor or ThreadPoolExecutor(max_workers=2, thread_name_prefix="query-embed")
        self._tracer = tracer or NoopTracer()  # stage spans: embed_query, dense, sparse, fuse, rerank
        self._analyser = query_analyser  # question-level knowledge (ragrpc.enrich; RAGRPC_ENRICHERS); None: none
        self._embedder = embedder
        self._chunks = chunks
        # the store's own vector search unless another retriever is given (query_service.dense)
        self._dense = dense if dense is not None else StoreDenseRetriever(chunks)
        self._visibility = visibility
        self._sparse = sparse
        self._reranker = reranker
        self._executor = executor
        # dense searches apart from the other searches where given (in-process ones wait for a shared pass)
        self._dense_executor = dense_executor or executor
        self._rerank_top_n = rerank_top_n
        self._clock = clock

    async def _embed_query(self, text: str) -> np.ndarray:
        """The query's vector, in the query-embedding threads (a slow or hung embeddings endpoint never
        holds up the searches of other calls), within the call's deadline."""
        left = deadlines.time_left_s()
        work = asyncio.get_running_loop().run_in_executor(
            self._embed_executor, in_current_context(self._embedder.embed_query), text
        )
        try:
            async with asyncio.timeout(None if left is None else max(0.0, left)):  # lighter than wait_for
                return await work  # type: ignore[no-any-return]
        except TimeoutError:
            raise errors.DeadlineError(
                "embedding the query did not finish within the call's deadline; retry, or give the call more time",
                reason="QUERY_EMBEDDING_TIMEOUT",
            ) from None

    async def _run(self, fn: Callable[..., Any], *args: Any, executor: Executor | None = None) -> Any:
        # in the caller's context (the current span, the deadline) in the executor thread
        return await asyncio.get_running_loop().run_in_executor(
            executor or self._executor, in_current_context(fn), *args
        )

    async def retrieve(self, query: RetrievalQuery) -> RetrievalResult:
        if not self._visibility.ready:
            raise errors.UnavailableError(
                "the query service is still loading its index of the collection; retry shortly",
                retry_after_s=5.0,
                reason="INDEX_LOADING",
            )
        timer = StageTimer()
        started = self._clock()
        if query.consistency is not None and self._consistency is not None:
            with timer.stage("consistency_wait"):
                await self._consistency.wait(query.consistency)
        analysis = self._analyser.analyse(query.text) if self._analyser is not None else QueryAnalysis()
        fields = self._chunks.metadata_fields
        expr = filter_from_request(
            query.tenant,
            query.collection,
            query.document_ids,
            query.sources,
            query.media_types,
            query.tags,
            query.time_after,
            query.time_before,
            metadata=[*query.metadata, *implied_conditions(analysis.filters, query.metadata, fields)],
            fields=fields,
        )
        if query.mode in ("hybrid", "sparse") and self._sparse is None:
            if query.mode == "sparse":
                raise errors.PreconditionError("sparse retrieval is disabled on this server (RAGRPC_SPARSE_BACKEND)")
        dense, sparse = await self._candidates(query, expr, timer, analysis.sparse_terms)
        with timer.stage("visibility"):
            dense, sparse = await self._visible(dense, sparse)
        with timer.stage("fuse"), self._tracer.span("fuse", dense_in=len(dense), sparse_in=len(sparse)) as span:
            fused, kind = self._fuse(query, dense, sparse)
            span.set(method=kind, rrf_k=query.rrf_k if kind == "rrf" else None, out=len(fused))
        with self._tracer.span("rerank", n_in=len(fused), **_reranker_attributes(self._reranker)) as span:
            fused, kind, reranked, skipped = await self._maybe_rerank(query, fused, kind, timer)
            span.set(reranked=reranked, skipped_reason=skipped or None, n_out=len(fused))
        if query.mmr_lambda is not None and len(fused) > 1:
            with timer.stage("diversify"):
                fused = await self._diversify(query, fused)
        if query.min_score is not None:
            fused = [h for h in fused if h.score >= query.min_score]
        hits = fused[: query.top_k]
        if any(not h.complete for h in hits):
            with timer.stage("fetch_rows"):
                hits = await self._complete(hits)
        if query.include_parent and hits:
            with timer.stage("parents"):
                await self._attach_parents(hits)
        timer.add("total", (self._clock() - started) * 1000.0)
        return RetrievalResult(
            hits=hits,
            score_kind=kind,
            timings=timer.timings,
            dense_candidates=len(dense),
            sparse_candidates=len(sparse),
            reranked=reranked,
            rerank_skipped_reason=skipped,
            sparse_backend=self._sparse.name if self._sparse and query.mode != "dense" else "",
        )

    async def _candidates(
        self, query: RetrievalQuery, expr: FilterExpr, timer: StageTimer, sparse_terms: tuple[str, ...] = ()
    ) -> tuple[list[ScoredChunk], list[ScoredChunk]]:
        async def dense() -> list[ScoredChunk]:
            if query.mode == "sparse":
                return []
            with (
                timer.stage("embed_query"),
                self._tracer.span("embed_query", **_embed_attributes(self._embedder, query)),
            ):
                vector = await self._embed_query(query.text)
            with (
                timer.stage("dense_search"),  # ids and visibility fields only: rows are read for the final hits
                self._tracer.span(
                    "dense", requested=query.candidates, collection=query.collection or None, search=self._dense.name
                ) as span,
            ):
                hits = await self._run(
                    self._dense.search,
                    vector,
                    query.tenant,
                    expr,
                    query.candidates,
                    query.document_ids or None,
                    executor=self._dense_executor,
                )
                span.set(hits=len(hits))
                return hits

        async def sparse() -> list[ScoredChunk]:
            if query.mode == "dense" or self._sparse is None:
                return []
            with (
                timer.stage("sparse_search"),
                self._tracer.span(
                    "sparse", backend=self._sparse.name, requested=query.candidates, query_words=len(query.text.split())
                ) as span,
            ):
                text = f"{query.text} {' '.join(sparse_terms)}" if sparse_terms else query.text  # the analysis' terms
                hits = await self._run(
                    self._sparse.search, text, query.tenant, expr, query.candidates, query.document_ids or None
                )
                span.set(hits=len(hits), added_terms=len(sparse_terms) or None)
                return hits

        dense_hits, sparse_hits = await asyncio.gather(dense(), sparse())
        return dense_hits, sparse_hits

    async def _visible(
        self, dense: list[ScoredChunk], sparse: list[ScoredChunk]
    ) -> tuple[list[ScoredChunk], list[ScoredChunk]]:
        """Drops chunks of superseded or unfinished ingestion attempts and deleted documents. While a
        document's replacement is being applied, hits of either version are kept, but of one
        document only the newest version among the hits (never a mix, never neither)."""
        hits = [*dense, *sparse]
        keys = [document_key(hit.chunk.tenant, hit.chunk.document_id) for hit in hits]
        seen: dict[str, set[str]] = {}
        for key, hit in zip(keys, hits, strict=True):
            seen.setdefault(key, set()).add(hit.chunk.generation)
        if not seen:
            return dense, sparse
        accepted = self._visibility.accepted_in_memory(seen)  # no thread needed for what the follower holds
        if accepted is None:
            accepted = await self._run(self._visibility.accepted, seen)
        shown: dict[str, str] = {}  # of each document, the newest accepted generation among its hits
        for key, generations in seen.items():
            for generation in reversed(accepted.get(key, ())):
                if generation in generations:
                    shown[key] = generation
                    break
        kept = [shown.get(key) == hit.chunk.generation for key, hit in zip(keys, hits, strict=True)]
        return (
            [hit for hit, keep in zip(dense, kept, strict=False) if keep],
            [hit for hit, keep in zip(sparse, kept[len(dense) :], strict=True) if keep],
        )

    def _fuse(
        self, query: RetrievalQuery, dense: list[ScoredChunk], sparse: list[ScoredChunk]
    ) -> tuple[list[ScoredChunk], str]:
        if query.mode == "dense" or (query.mode == "hybrid" and self._sparse is None):
            return list(dense), "cosine"
        if query.mode == "sparse":
            return list(sparse), "bm25"
        limit = self._fused_needed(query)
        if query.fusion == "weighted":
            return WeightedFusion(query.dense_weight, query.sparse_weight).fuse(dense, sparse, limit), "weighted"
        return RrfFusion(query.rrf_k).fuse(dense, sparse, limit), "rrf"

    def _fused_needed(self, query: RetrievalQuery) -> int | None:
        """How many of the fused ranking's best the later stages can read: the top-k, the reranker's
        head, the MMR pool (None, all of them, with a minimum score: its filter runs after the rerank,
        on the reranked head's scores and the rest's fused ones)."""
        if query.min_score is not None:
            return None
        needed = query.top_k
        if self._reranker is not None and query.rerank:
            needed = max(needed, self._rerank_top_n)
        if query.mmr_lambda is not None:
            needed = max(needed, _mmr_pool(query.top_k))
        return needed

    async def _maybe_rerank(
        self, query: RetrievalQuery, hits: list[ScoredChunk], kind: str, timer: StageTimer
    ) -> tuple[list[ScoredChunk], str, bool, str]:
        if self._reranker is None:
            return hits, kind, False, "no reranker configured"
        if not query.rerank:
            return hits, kind, False, "disabled by request"
        if not hits:
            return hits, kind, False, "no candidates"
        with timer.stage("rerank"):
            head = await self._complete(hits[: self._rerank_top_n])  # the reranker reads the texts
            try:  # `_run` keeps the call's context: a remote reranker reads the RPC deadline (and the request id)
                reranked = await self._run(self._reranker.rerank, query.text, head, len(head))
            except RerankUnavailableError as exc:  # logged and counted by the reranker
                return hits, kind, False, exc.summary
        return list(reranked) + hits[len(head) :], "rerank", True, ""

    async def _complete(self, hits: list[ScoredChunk]) -> list[ScoredChunk]:
        """The hits with their stored rows: one read by primary key for those that have only their hit
        fields (a hit whose row vanished meanwhile, a document deleted in between, is dropped)."""
        missing = [h.chunk for h in hits if not h.complete]
        if not missing:
            return hits
        rows = await self._rows_of(missing, with_vectors=False)
        completed = []
        for hit in hits:
            if hit.complete:
                completed.append(hit)
            elif hit.chunk.chunk_id in rows:
                completed.append(dataclasses.replace(hit, chunk=rows[hit.chunk.chunk_id], complete=True))
        return completed

    async def _rows_of(self, chunks: list[ChunkRecord], *, with_vectors: bool) -> dict[str, ChunkRecord]:
        """Stored rows by chunk id, read by key; a row of another tenant than its hit's is never returned."""
        tenants = {c.chunk_id: c.tenant for c in chunks}
        stored = await self._run(self._chunks.get_chunks, list(tenants), with_vectors)
        return {c.chunk_id: c for c in stored if tenants.get(c.chunk_id) == c.tenant}

    async def _diversify(self, query: RetrievalQuery, hits: list[ScoredChunk]) -> list[ScoredChunk]:
        pool = hits[: _mmr_pool(query.top_k)]
        stored = await self._rows_of([h.chunk for h in pool], with_vectors=True)
        vectors = {chunk_id: c.vector for chunk_id, c in stored.items()}
        usable = [h for h in pool if vectors.get(h.chunk.chunk_id)]
        if len(usable) < 2:
            return hits
        matrix = np.asarray([vectors[h.chunk.chunk_id] for h in usable], dtype=np.float32)
        assert query.mmr_lambda is not None
        chosen = MmrDiversifier(query.mmr_lambda).diversify(usable, matrix, query.top_k)
        return list(chosen)

    async def _attach_parents(self, hits: list[ScoredChunk]) -> None:
        wanted = {h.chunk.parent_id: h.chunk for h in hits if h.chunk.parent_id}
        if not wanted:
            return
        stored = await self._run(self._chunks.get_chunks, list(wanted), False)
        texts = {c.chunk_id: c.text for c in stored if c.tenant == wanted[c.chunk_id].tenant}
        for hit in hits:
            if hit.chunk.parent_id in texts:
                hit.chunk.parent_text = texts[hit.chunk.parent_id]


def _mmr_pool(top_k: int) -> int:
    """How many of the best hits MMR chooses the top-k from."""
    return max(top_k * 4, 20)


def _embed_attributes(embedder: Embedder, query: RetrievalQuery) -> dict[str, Any]:
    return {
        "gen_ai.operation.name": "embeddings",
        "gen_ai.request.model": embedder.model_id,
        "query_chars": len(query.text),
    }


def _reranker_attributes(reranker: Reranker | None) -> dict[str, Any]:
    """Which reranker (its class) and model (a cross-encoder's path, a remote reranker's configured model)."""
    if reranker is None:
        return {}
    model = getattr(reranker, "model_name_or_path", None) or getattr(getattr(reranker, "config", None), "model", None)
    return {"provider": type(reranker).__name__, "model": model or None}
