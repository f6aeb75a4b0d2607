"""Retrieve and Ask through the real query service's gRPC API with the remote reranker (built from
settings by the composition root) against a real local rerank server: the reranker's order is the
streamed order, a failing or slow reranker degrades to the fused order with the reason in the
summary, and the RPC deadline (the client's or the server's) is kept."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import grpc
import pytest

from ingest_service.app import build_components as build_ingest
from ingest_service.requests import DocumentSpecInput, IngestItem
from query_service.app import build_components as build_query
from query_service.app import build_reranker, start_query_server
from ragrpc.config import Settings
from ragrpc.metrics import Metrics
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry
from ragrpc.v1 import common_pb2, retrieve_pb2, retrieve_pb2_grpc
from tests.support.rerank_server import Behaviour, RerankServer, relevance

QUERY = "where do mallards live near lakes"
DOCUMENTS = {  # word overlap 2/6, 3/6, 0, 4/6: one reranked order, unlike BM25's (which drops stop words)
    "lakes": "Mallards at lakes.",
    "parks": "Mallards live in parks near cities.",
    "teal": "Teal ducks are small.",
    "stop": "Where do you live near here?",
}


@pytest.fixture
def rerank_server() -> Iterator[RerankServer]:
    with RerankServer() as server:
        yield server


@asynccontextmanager
async def query_service(settings: Settings, server: RerankServer, metrics: Metrics) -> AsyncIterator[str]:
    """The query service over in-memory stores holding DOCUMENTS, reranking remotely; yields its address."""
    configured = dataclasses.replace(
        settings, reranker_url=f"{server.url}/v1/rerank", reranker_model="rerank-test", rerank_top_n=10
    )
    chunks, registry, embedder = InMemoryChunkStore(), InMemoryDocumentRegistry(), HashingEmbedder()
    ingest = build_ingest(configured, embedder, chunks, registry)
    for doc_id, text in DOCUMENTS.items():
        await ingest.pipeline.ingest(
            IngestItem("default", DocumentSpecInput(document_id=doc_id, file_name=f"{doc_id}.txt"), text.encode())
        )
    reranker = build_reranker(configured, metrics)
    query = build_query(configured, embedder, chunks, registry, reranker=reranker, metrics=metrics)
    running = await start_query_server(configured, query, "127.0.0.1:0", metrics=metrics)
    try:
        yield f"127.0.0.1:{running.port}"
    finally:
        await running.stop(0)
        ingest.shutdown()
        query.executor.shutdown(wait=False, cancel_futures=True)


async def retrieve(
    stub: retrieve_pb2_grpc.RetrieveServiceStub, *, rerank: bool = True, timeout: float | None = None
) -> tuple[list[common_pb2.ScoredChunk], retrieve_pb2.RetrievalSummary]:
    request = retrieve_pb2.RetrieveRequest(query=QUERY, options=retrieve_pb2.RetrievalOptions(rerank=rerank))
    responses = [r async for r in stub.Retrieve(request, timeout=timeout)]
    assert responses[-1].HasField("summary")
    return [r.chunk for r in responses[:-1]], responses[-1].summary


def doc_ids(chunks: list[common_pb2.ScoredChunk]) -> list[str]:
    return [c.chunk.document_id for c in chunks]


async def test_reranked_over_grpc_and_degraded_on_failure(settings: Settings, rerank_server: RerankServer) -> None:
    metrics = Metrics()
    async with (
        query_service(settings, rerank_server, metrics) as address,
        grpc.aio.insecure_channel(address) as channel,
    ):
        stub = retrieve_pb2_grpc.RetrieveServiceStub(channel)
        fused, plain = await retrieve(stub, rerank=False)
        assert plain.rerank_skipped_reason == "disabled by request" and len(fused) == len(DOCUMENTS)
        chunks, summary = await retrieve(stub)
        by_relevance = sorted(DOCUMENTS, key=lambda d: -relevance(QUERY, DOCUMENTS[d]))
        assert doc_ids(chunks) == by_relevance != doc_ids(fused)
        assert summary.reranked and summary.rerank_skipped_reason == ""
        assert [c.rank for c in chunks] == [1, 2, 3, 4]
        assert all(c.score_kind == common_pb2.SCORE_KIND_RERANK for c in chunks)
        assert [c.score for c in chunks] == [relevance(QUERY, DOCUMENTS[d]) for d in by_relevance]
        assert all(c.stage_scores.rerank == c.score and c.stage_scores.HasField("fused") for c in chunks)

        rerank_server.set_default(Behaviour.error(500))
        degraded, summary = await retrieve(stub)
        assert doc_ids(degraded) == doc_ids(fused) and [c.score for c in degraded] == [c.score for c in fused]
        assert not summary.reranked
        assert summary.rerank_skipped_reason.startswith("rerank failed (http_status): HTTP 500")
        assert all(c.score_kind == common_pb2.SCORE_KIND_RRF for c in degraded)
        events = [e async for e in stub.Ask(retrieve_pb2.AskRequest(query=QUERY))]
        final = events[-1].final
        assert final.answer and not final.retrieval.reranked
        assert final.retrieval.rerank_skipped_reason.startswith("rerank failed (http_status)")
    text = metrics.exposition().decode()
    assert 'ragrpc_rerank_failures_total{cause="http_status"} 2.0' in text


@pytest.mark.parametrize("whose", ["client", "server"])
async def test_a_slow_reranker_cannot_break_the_deadline(
    settings: Settings, rerank_server: RerankServer, whose: str
) -> None:
    """The reranker would answer in 30 s and its own timeout is 30 s; the call's deadline is 2 s."""
    settings = dataclasses.replace(
        settings, reranker_timeout_s=30.0, query_call_timeout_s=2.0 if whose == "server" else 120.0
    )
    metrics = Metrics()
    async with (
        query_service(settings, rerank_server, metrics) as address,
        grpc.aio.insecure_channel(address) as channel,
    ):
        stub = retrieve_pb2_grpc.RetrieveServiceStub(channel)
        fused, _ = await retrieve(stub, rerank=False)
        rerank_server.set_default(Behaviour.slow(30.0))
        started = time.monotonic()
        chunks, summary = await retrieve(stub, timeout=2.0 if whose == "client" else None)
        elapsed = time.monotonic() - started
    assert elapsed < 2.0, elapsed  # answered (status OK), within the deadline
    assert doc_ids(chunks) == doc_ids(fused) and not summary.reranked
    assert summary.rerank_skipped_reason.startswith("rerank failed (deadline): no answer within")
    assert summary.rerank_skipped_reason.endswith("(the request's deadline); fused order kept")
    (request,) = rerank_server.requests
    assert request.finished_at is None or request.finished_at - request.received_at < 2.0
    assert metrics.registry.get_sample_value("ragrpc_rerank_failures_total", {"cause": "deadline"}) == 1.0
