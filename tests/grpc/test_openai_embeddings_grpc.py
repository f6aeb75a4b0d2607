"""Both services as real in-process servers over the in-memory stores, embedding through an
OpenAI-compatible endpoint (a real local HTTP server, tests/support/embeddings_server.py): a
document is ingested and found by a query; an endpoint that keeps failing makes the upload
UNAVAILABLE, a wrong dimension FAILED_PRECONDITION, and neither stores anything; a service at
another dimension refuses the collection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from ragrpc import errors
from ragrpc.config import Settings
from ragrpc.models import DocumentState
from ragrpc.openai_embeddings import OpenAiEmbedder
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.store.model_record import EmbeddingIdentity
from ragrpc.testing import InMemoryChunkStore, InMemoryDocumentRegistry
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc, retrieve_pb2, retrieve_pb2_grpc
from tests.conftest import FakeStack, running_stack
from tests.support.embeddings_server import Behaviour, EmbeddingsServer
from tests.support.rpc_details import rpc_details

DUCKS = (
    b"# Ducks\n\nDucks are waterfowl that swim on ponds and eat water plants.\n\n"
    b"## Habitat\n\nMallards live near lakes, rivers and city parks across the northern hemisphere.\n"
)
STOCKS = b"The stock market fell sharply on Tuesday after the central bank raised interest rates."


@pytest.fixture
async def openai_stack(settings: Settings) -> AsyncIterator[tuple[FakeStack, EmbeddingsServer]]:
    with EmbeddingsServer(dimension=64) as server:
        embedder = OpenAiEmbedder("test-embed", base_url=server.url, request_size=2, max_retries=1, timeout_s=5.0)
        await asyncio.to_thread(embedder.warm_up)
        registry = InMemoryDocumentRegistry()
        registry.ensure_model(EmbeddingIdentity(embedder.model_id, embedder.dimension, embedder.provider))
        stores = FakeStack(embedder, InMemoryChunkStore(), registry)  # type: ignore[arg-type]
        try:
            async with running_stack(settings, stores) as stack:
                yield stack, server
        finally:
            embedder.close()


async def _upload(stub: ingest_pb2_grpc.IngestServiceStub, name: str, content: bytes, document_id: str) -> Any:
    async def messages():  # type: ignore[no-untyped-def]
        yield ingest_pb2.UploadDocumentRequest(header=ingest_pb2.DocumentSpec(file_name=name, document_id=document_id))
        yield ingest_pb2.UploadDocumentRequest(data=content)

    return await stub.UploadDocument(messages())


def _chunks_of(stack: FakeStack, document_id: str) -> int:
    return stack.chunks.count_chunks(f.eq(s.DOCUMENT_ID, document_id))


async def test_ingest_and_query_embed_through_the_endpoint(openai_stack) -> None:  # type: ignore[no-untyped-def]
    stack, server = openai_stack
    server.clear()
    async with (
        grpc.aio.insecure_channel(stack.ingest_address) as ingest_channel,
        grpc.aio.insecure_channel(stack.query_address) as query_channel,
    ):
        ingest = ingest_pb2_grpc.IngestServiceStub(ingest_channel)
        ducks = await _upload(ingest, "ducks.md", DUCKS, "ducks")
        await _upload(ingest, "stocks.txt", STOCKS, "stocks")
        assert ducks.document.state == ingest_pb2.DOCUMENT_STATE_ACTIVE and ducks.document.chunk_count >= 1
        embedded = [text for r in server.requests for text in r.inputs]
        assert any("Mallards" in text for text in embedded) and any("stock market" in text for text in embedded)
        assert all(len(r.inputs) <= 2 for r in server.requests)  # RAGRPC_EMBEDDING_REQUEST_SIZE-sized requests
        query = retrieve_pb2_grpc.RetrieveServiceStub(query_channel)
        responses = [r async for r in query.Retrieve(retrieve_pb2.RetrieveRequest(query="where do mallards live"))]
    chunks = [r.chunk for r in responses if r.HasField("chunk")]
    assert chunks and chunks[0].chunk.document_id == "ducks"
    assert server.requests[-1].inputs == ["where do mallards live"]  # the query was embedded by the endpoint too


async def test_endpoint_failures_fail_the_upload_and_store_nothing(openai_stack) -> None:  # type: ignore[no-untyped-def]
    stack, server = openai_stack
    async with grpc.aio.insecure_channel(stack.ingest_address) as channel:
        ingest = ingest_pb2_grpc.IngestServiceStub(channel)
        server.set_default(Behaviour.error(500))
        with pytest.raises(grpc.aio.AioRpcError) as down:
            await _upload(ingest, "frogs.txt", b"Frogs sing in the marsh at night.", "frogs")
        server.set_default(Behaviour.ok(dimension=32))
        with pytest.raises(grpc.aio.AioRpcError) as wrong:
            await _upload(ingest, "owls.txt", b"Owls hunt mice in the barn at dusk.", "owls")
    assert down.value.code() == grpc.StatusCode.UNAVAILABLE
    details = rpc_details(down.value)
    assert details["ErrorInfo"].reason == "EMBEDDING_UNAVAILABLE" and "RetryInfo" in details
    assert "HTTP 500" in down.value.details()
    assert wrong.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert rpc_details(wrong.value)["ErrorInfo"].reason == "EMBEDDING_DIMENSION_MISMATCH"
    assert "32-dimensional" in wrong.value.details() and "expected 64" in wrong.value.details()
    for document_id in ("frogs", "owls"):
        record = stack.registry.get("default", document_id)
        assert record is not None and record.state == DocumentState.FAILED
        assert _chunks_of(stack, document_id) == 0
    with pytest.raises(errors.ModelMismatchError, match="64 dimensions, provider openai"):
        stack.registry.ensure_model(EmbeddingIdentity("test-embed", 32, "openai"), create=False)


async def test_a_hung_query_embedding_ends_at_the_call_deadline_and_blocks_no_other_search(openai_stack) -> None:  # type: ignore[no-untyped-def]
    """An embeddings endpoint that hangs (30 s here; the client would retry it for minutes): a hybrid
    query ends with DEADLINE_EXCEEDED at its own deadline, and while four of them hang, sparse
    queries (which embed nothing) are answered at once: query embedding has threads of its own."""
    stack, server = openai_stack
    ingest = ingest_pb2_grpc.IngestServiceStub(grpc.aio.insecure_channel(stack.ingest_address))
    await _upload(ingest, "ducks.md", DUCKS, "ducks")
    await stack.followed()
    server.set_default(Behaviour.slow(30.0))
    channel = grpc.aio.insecure_channel(stack.query_address)
    query = retrieve_pb2_grpc.RetrieveServiceStub(channel)

    async def search(mode: int, timeout: float) -> list[Any]:
        request = retrieve_pb2.RetrieveRequest(query="ducks ponds", options=retrieve_pb2.RetrievalOptions(mode=mode))
        return [r async for r in query.Retrieve(request, timeout=timeout)]

    hung = [asyncio.ensure_future(search(retrieve_pb2.RETRIEVAL_MODE_HYBRID, 2.0)) for _ in range(4)]
    await asyncio.sleep(0.2)
    started = asyncio.get_running_loop().time()
    answers = await asyncio.gather(*(search(retrieve_pb2.RETRIEVAL_MODE_SPARSE, 5.0) for _ in range(8)))
    assert asyncio.get_running_loop().time() - started < 1.5
    assert all(any(r.HasField("chunk") for r in answer) for answer in answers)
    for call in hung:
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await call
        assert ended.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    server.set_default(Behaviour.ok())
    await channel.close()
