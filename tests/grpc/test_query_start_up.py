"""The query service listens while it loads its index of the collection: health answers
NOT_SERVING and Retrieve answers UNAVAILABLE (INDEX_LOADING, with RetryInfo) until the registry
follower and the BM25 index hold every document; then the service's `after_load` runs (its main
freezes the loaded heap there), then SERVING, and every document is found."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Iterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ingest_service.app import build_components as build_ingest
from ingest_service.requests import DocumentSpecInput, IngestItem
from query_service.app import build_components as build_query
from query_service.app import start_query_server
from ragrpc.config import Settings
from ragrpc.models import DocumentRecord
from ragrpc.store.filters import FilterExpr
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry
from ragrpc.v1 import retrieve_pb2, retrieve_pb2_grpc
from tests.support.rpc_details import rpc_details


class GatedRegistry(InMemoryDocumentRegistry):
    """A registry whose scans wait for `gate` (a slow start-up load over a large collection)."""

    def __init__(self) -> None:
        super().__init__(page_size=3)
        self.gate = threading.Event()

    def scan(self, expr: FilterExpr) -> Iterator[list[DocumentRecord]]:
        self.gate.wait(30)
        yield from super().scan(expr)


async def _status(channel: grpc.aio.Channel) -> int:
    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
    return reply.status


async def test_not_serving_and_unavailable_until_the_index_is_loaded(settings: Settings) -> None:
    chunks, registry, embedder = InMemoryChunkStore(), GatedRegistry(), HashingEmbedder()
    registry.gate.set()
    ingest = build_ingest(settings, embedder, chunks, registry)
    for i in range(7):
        spec = DocumentSpecInput(document_id=f"d{i}", file_name="d.txt")
        await ingest.pipeline.ingest(IngestItem(settings.tenant, spec, f"Note {i} on wombat{i}.".encode()))
    registry.gate.clear()
    query = build_query(dataclasses.replace(settings), embedder, chunks, registry, load=False)
    loaded: list[int] = []  # documents followed when `after_load` ran (the main freezes the heap there)
    running = await start_query_server(
        settings, query, "127.0.0.1:0", after_load=lambda: loaded.append(query.follower.document_count)
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            assert await _status(channel) == health_pb2.HealthCheckResponse.NOT_SERVING
            assert loaded == []
            stub = retrieve_pb2_grpc.RetrieveServiceStub(channel)
            try:
                [r async for r in stub.Retrieve(retrieve_pb2.RetrieveRequest(query="wombat3"))]
                raise AssertionError("Retrieve answered before the index was loaded")
            except grpc.aio.AioRpcError as error:
                assert error.code() == grpc.StatusCode.UNAVAILABLE
                details = rpc_details(error)
                assert details["ErrorInfo"].reason == "INDEX_LOADING" and "RetryInfo" in details
            registry.gate.set()
            for _ in range(500):
                if await _status(channel) == health_pb2.HealthCheckResponse.SERVING:
                    break
                await asyncio.sleep(0.01)
            assert await _status(channel) == health_pb2.HealthCheckResponse.SERVING
            assert query.follower.document_count == 7
            assert loaded == [7]  # once, after the whole load, before SERVING (the load task's order)
            request = retrieve_pb2.RetrieveRequest(
                query="wombat3", options=retrieve_pb2.RetrievalOptions(mode=retrieve_pb2.RETRIEVAL_MODE_SPARSE)
            )
            responses = [r async for r in stub.Retrieve(request)]
            assert [r.chunk.chunk.document_id for r in responses if r.HasField("chunk")][:1] == ["d3"]
    finally:
        await running.stop(0)
        ingest.shutdown()
        query.executor.shutdown(wait=False)
