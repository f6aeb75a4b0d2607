"""The retrieval pipeline with the remote reranker (built from settings by the composition root)
against a real local rerank server: its order is the order of the hits, only RAGRPC_RERANK_TOP_N
candidates are sent, a failure keeps the fused order with the reason in the summary (and counts
it), and the RPC deadline in the call's context reaches the reranker in its executor thread."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator

import pytest

from ingest_service.app import build_components as build_ingest
from ingest_service.requests import DocumentSpecInput, IngestItem
from query_service import convert
from query_service.app import QueryComponents, build_reranker
from query_service.app import build_components as build_query
from query_service.retrieval_types import RetrievalQuery
from ragrpc import deadlines
from ragrpc.config import Settings
from ragrpc.metrics import Metrics
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry
from tests.support.rerank_server import Behaviour, RerankServer, ranked

QUERY = "ducks swim on the pond"
DOCUMENTS = {  # relevance (share of the query's words) 1.0, 0.6, 0.2, 0.4, 0.0, 0.8: no ties
    "d0": "Ducks swim on the pond at dawn.",
    "d1": "Ducks nest near the pond.",
    "d2": "A pond freezes in winter.",
    "d3": "Geese and ducks swim together.",
    "d4": "Lessons for children.",
    "d5": "Ducks, geese and swans all swim in the pond.",
}


@pytest.fixture
async def world() -> AsyncIterator[tuple[RerankServer, QueryComponents, Metrics]]:
    chunks, registry, embedder = InMemoryChunkStore(), InMemoryDocumentRegistry(), HashingEmbedder()
    with RerankServer() as server:
        settings = dataclasses.replace(
            Settings(),
            workers=2,
            sparse_backend="rank_bm25",
            reranker_url=f"{server.url}/v1/rerank",
            reranker_model="rerank-test",
            rerank_top_n=4,
        )
        metrics = Metrics()
        ingest = build_ingest(settings, embedder, chunks, registry)
        for doc_id, text in DOCUMENTS.items():
            spec = DocumentSpecInput(document_id=doc_id, file_name=f"{doc_id}.txt")
            await ingest.pipeline.ingest(IngestItem("a", spec, text.encode()))
        query = build_query(settings, embedder, chunks, registry, reranker=build_reranker(settings, metrics))
        query.follower.poll()  # BM25 sees the documents (the service's background task does this)
        try:
            yield server, query, metrics
        finally:
            ingest.shutdown()
            query.executor.shutdown(wait=False, cancel_futures=True)


def ids(result) -> list[str]:  # type: ignore[no-untyped-def]
    return [h.chunk.document_id for h in result.hits]


async def fused_order(query: QueryComponents) -> list[str]:
    return ids(await query.retrieval.retrieve(RetrievalQuery(text=QUERY, tenant="a", rerank=False)))


async def test_reranked_head_then_the_fused_rest(world) -> None:  # type: ignore[no-untyped-def]
    server, query, _ = world
    fused = await fused_order(query)
    assert len(fused) == len(DOCUMENTS)
    result = await query.retrieval.retrieve(RetrievalQuery(text=QUERY, tenant="a"))
    (request,) = server.requests
    assert request.body["documents"] == [DOCUMENTS[d] for d in fused[:4]]  # RAGRPC_RERANK_TOP_N=4, fused order
    assert request.body["top_n"] == 4 and request.body["model"] == "rerank-test"
    expected_head = [fused[i] for i, _ in ranked(QUERY, request.body["documents"])]
    assert ids(result) == expected_head + fused[4:]
    assert result.reranked and result.score_kind == "rerank" and result.rerank_skipped_reason == ""
    head_scores = [h.scores.rerank for h in result.hits[:4]]
    assert head_scores == sorted(head_scores, reverse=True) and all(s is not None for s in head_scores)
    assert all(h.scores.rerank is None for h in result.hits[4:])
    assert "rerank" in [name for name, _ in result.timings]


@pytest.mark.parametrize(
    ("behaviour", "cause", "reason"),
    [
        (Behaviour.error(500), "http_status", "HTTP 500"),
        (Behaviour.malformed("not_json"), "malformed", "not JSON"),
        (Behaviour.wrong_indexes("out_of_range"), "bad_indexes", "index 9 for 4 documents"),
    ],
)
async def test_a_failure_keeps_the_fused_order_and_says_why(world, behaviour, cause, reason) -> None:  # type: ignore[no-untyped-def]
    server, query, metrics = world
    fused = await fused_order(query)
    server.set_default(behaviour)
    result = await query.retrieval.retrieve(RetrievalQuery(text=QUERY, tenant="a"))
    assert ids(result) == fused
    assert not result.reranked and result.score_kind == "rrf"
    assert result.rerank_skipped_reason.startswith(f"rerank failed ({cause}): ")
    assert reason in result.rerank_skipped_reason and result.rerank_skipped_reason.endswith("; fused order kept")
    assert all(h.scores.rerank is None for h in result.hits)
    summary = convert.summary_to_pb(result)
    assert not summary.reranked and summary.rerank_skipped_reason == result.rerank_skipped_reason
    assert metrics.registry.get_sample_value("ragrpc_rerank_failures_total", {"cause": cause}) == 1.0


async def test_the_call_deadline_reaches_the_reranker(world) -> None:  # type: ignore[no-untyped-def]
    server, query, metrics = world
    fused = await fused_order(query)
    server.set_default(Behaviour.slow(10.0))
    deadlines.set_call_deadline(0.8)  # what the DeadlineInterceptor sets for an RPC
    started = time.monotonic()
    result = await query.retrieval.retrieve(RetrievalQuery(text=QUERY, tenant="a"))
    elapsed = time.monotonic() - started
    assert elapsed < 0.8, elapsed
    assert ids(result) == fused and not result.reranked
    assert result.rerank_skipped_reason.startswith("rerank failed (deadline): no answer within")
    assert metrics.registry.get_sample_value("ragrpc_rerank_failures_total", {"cause": "deadline"}) == 1.0
