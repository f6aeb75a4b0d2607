"""The clients' retry policy against a real in-process gRPC server: the first attempt of every
call fails with UNAVAILABLE (through the services' own error mapping) and later attempts
succeed, so an idempotent call succeeds transparently on its second attempt and a
non-idempotent one fails after exactly one; retries stop when the target's budget is spent."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from clients import AsyncIngestClient, AsyncRetrieveClient, IngestClient, ResourceExhausted, Unavailable
from clients.channel import MAX_RETRY_ATTEMPTS, RETRY_MAX_TOKENS, RETRY_TOKEN_RATIO
from ragrpc import errors
from ragrpc.grpc_errors import abort_with_error
from ragrpc.v1 import common_pb2, ingest_pb2, ingest_pb2_grpc, retrieve_pb2, retrieve_pb2_grpc

PREVIOUS_ATTEMPTS_KEY = "grpc-previous-rpc-attempts"  # set by gRPC itself on a retry (gRFC A6)
RETRY_BUFFER_BYTES = 256 * 1024  # gRPC's default grpc.per_rpc_retry_buffer_size


class _FailsFirstAttempt(ingest_pb2_grpc.IngestServiceServicer, retrieve_pb2_grpc.RetrieveServiceServicer):
    """Every call's first attempt fails with UNAVAILABLE, later ones succeed; keys that start
    with "always" fail every attempt, "ok" none, "exhausted" fails with RESOURCE_EXHAUSTED."""

    def __init__(self) -> None:
        self.attempts: Counter[str] = Counter()
        self.previous_attempts: dict[str, list[str]] = {}

    async def _attempt(self, key: str, context: grpc.aio.ServicerContext) -> None:
        self.attempts[key] += 1
        metadata = dict(context.invocation_metadata() or ())
        self.previous_attempts.setdefault(key, []).append(str(metadata.get(PREVIOUS_ATTEMPTS_KEY, "0")))
        if key.startswith("exhausted"):
            await abort_with_error(context, errors.LimitExceededError("busy"))
        if key.startswith("always") or (self.attempts[key] == 1 and not key.startswith("ok")):
            await abort_with_error(context, errors.UnavailableError("store is down", retry_after_s=0.1))

    async def GetDocument(self, request, context):  # type: ignore[no-untyped-def]
        await self._attempt(request.document_id, context)
        return ingest_pb2.GetDocumentResponse(document=ingest_pb2.Document(document_id=request.document_id))

    async def ListDocuments(self, request, context):  # type: ignore[no-untyped-def]
        await self._attempt(f"list:{request.page_token}", context)
        return ingest_pb2.ListDocumentsResponse(documents=[ingest_pb2.Document(document_id="d1")])

    async def GetIngestJob(self, request, context):  # type: ignore[no-untyped-def]
        await self._attempt(request.job_id, context)
        return ingest_pb2.GetIngestJobResponse(job=ingest_pb2.IngestJob(job_id=request.job_id, done=True))

    async def DeleteDocument(self, request, context):  # type: ignore[no-untyped-def]
        await self._attempt(request.document_id, context)
        return ingest_pb2.DeleteDocumentResponse(chunks_deleted=3)

    async def UpdateDocument(self, request, context):  # type: ignore[no-untyped-def]
        await self._attempt(request.document.document_id, context)
        return ingest_pb2.UpdateDocumentResponse(document=request.document)

    async def UploadDocument(self, request_iterator, context):  # type: ignore[no-untyped-def]
        header, size = None, 0
        async for message in request_iterator:
            header = header or message.header
            size += len(message.data)
        await self._attempt(header.document_id, context)
        document = ingest_pb2.Document(document_id=header.document_id, size_bytes=size)
        return ingest_pb2.UploadDocumentResponse(document=document)

    async def IngestDocuments(self, request, context):  # type: ignore[no-untyped-def]
        await self._attempt(request.documents[0].spec.document_id, context)
        yield ingest_pb2.IngestDocumentsResponse(job_id="job-1", summary=ingest_pb2.IngestSummary(succeeded=1))

    async def Retrieve(self, request, context):  # type: ignore[no-untyped-def]
        await self._attempt(request.query, context)
        yield retrieve_pb2.RetrieveResponse(chunk=common_pb2.ScoredChunk(chunk=common_pb2.Chunk(chunk_id="c1"), rank=1))

    async def Ask(self, request, context):  # type: ignore[no-untyped-def]
        await self._attempt(request.query, context)
        yield retrieve_pb2.AskResponse(final=retrieve_pb2.AskFinal(answer="forty-two"))


@asynccontextmanager
async def _server() -> AsyncIterator[tuple[str, _FailsFirstAttempt]]:
    """A fresh server on a fresh port, so the target's retry budget starts full."""
    servicer = _FailsFirstAttempt()
    server = grpc.aio.server()
    ingest_pb2_grpc.add_IngestServiceServicer_to_server(servicer, server)
    retrieve_pb2_grpc.add_RetrieveServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        await server.stop(0)


Call = Callable[[AsyncIngestClient, AsyncRetrieveClient], Awaitable[Any]]

RETRIED: dict[str, tuple[str, Call]] = {
    "GetDocument": ("doc-1", lambda i, r: i.get_document("doc-1")),
    "ListDocuments": ("list:", lambda i, r: i.list_documents_page()),
    "GetIngestJob": ("job-7", lambda i, r: i.get_job("job-7")),
    "DeleteDocument": ("doc-2", lambda i, r: i.delete_document("doc-2")),
    "UploadDocument": ("doc-3", lambda i, r: i.upload(b"hello", file_name="a.txt", document_id="doc-3")),
    "IngestDocuments": ("doc-4", lambda i, r: i.ingest([{"content": b"hi", "document_id": "doc-4"}]).drain()),
    "Retrieve": ("what is milvus", lambda i, r: r.retrieve("what is milvus").drain()),
    "Ask": ("why", lambda i, r: r.ask("why").drain()),
}


@pytest.mark.parametrize("method", sorted(RETRIED))
async def test_idempotent_calls_succeed_on_a_transparent_retry(method: str) -> None:
    key, call = RETRIED[method]
    async with _server() as (address, servicer):
        async with AsyncIngestClient(address) as ingest, AsyncRetrieveClient(address) as query:
            await call(ingest, query)
    assert servicer.attempts == {key: 2}
    assert servicer.previous_attempts[key] == ["0", "1"]  # gRPC's own retry, not the client library's


async def test_update_is_not_retried() -> None:
    async with _server() as (address, servicer):
        async with AsyncIngestClient(address) as ingest:
            with pytest.raises(Unavailable):
                await ingest.update_document("doc-5", title="New title")
            assert (await ingest.update_document("doc-5", title="New title")).title == "New title"  # the caller's call
    assert servicer.attempts == {"doc-5": 2}
    assert servicer.previous_attempts["doc-5"] == ["0", "0"]


async def test_resource_exhausted_is_not_retried() -> None:
    async with _server() as (address, servicer):
        async with AsyncRetrieveClient(address) as query:
            with pytest.raises(ResourceExhausted):
                await query.retrieve("exhausted").drain()
    assert servicer.attempts == {"exhausted": 1}


async def test_an_upload_beyond_the_retry_buffer_is_not_retried() -> None:
    async with _server() as (address, servicer):
        async with AsyncIngestClient(address) as ingest:
            small = await ingest.upload(b"x" * (RETRY_BUFFER_BYTES // 2), file_name="a.txt", document_id="small")
            with pytest.raises(Unavailable):
                await ingest.upload(b"x" * (RETRY_BUFFER_BYTES + 1), file_name="b.txt", document_id="large")
    assert small.size_bytes == RETRY_BUFFER_BYTES // 2
    assert servicer.attempts == {"small": 2, "large": 1}


async def test_the_sync_client_retries_the_same_way() -> None:
    async with _server() as (address, servicer):
        with IngestClient(address) as ingest:
            document = await asyncio.to_thread(ingest.get_document, "doc-6")
            with pytest.raises(Unavailable):
                await asyncio.to_thread(ingest.update_document, "doc-7", title="t")
    assert document.document_id == "doc-6"
    assert servicer.attempts == {"doc-6": 2, "doc-7": 1}


def _throttled_attempts(calls: int) -> tuple[list[int], float]:
    """Attempts per always-failing call under gRFC A6 throttling, and the tokens left: each
    failure takes a token, and a failure that leaves maxTokens/2 or fewer is not retried."""
    tokens, per_call = float(RETRY_MAX_TOKENS), []
    for _ in range(calls):
        attempts = 0
        while True:
            attempts += 1
            tokens = max(0.0, tokens - 1)
            if tokens <= RETRY_MAX_TOKENS / 2 or attempts == MAX_RETRY_ATTEMPTS:
                break
        per_call.append(attempts)
    return per_call, tokens


async def test_a_storm_of_failures_spends_the_retry_budget() -> None:
    calls = 6
    expected, tokens_left = _throttled_attempts(calls)
    async with _server() as (address, servicer):
        async with AsyncIngestClient(address) as ingest:
            for i in range(calls):
                with pytest.raises(Unavailable):
                    await ingest.get_document(f"always-{i}")
            attempts = [servicer.attempts[f"always-{i}"] for i in range(calls)]
            assert attempts == expected
            assert attempts[0] == MAX_RETRY_ATTEMPTS and attempts[-1] == 1
            assert sum(attempts) - calls <= RETRY_MAX_TOKENS / 2  # the extra load is bounded
            # successes refill the bucket (tokenRatio each); once above half, failures are retried again
            refills = math.ceil((RETRY_MAX_TOKENS / 2 + 1 - tokens_left) / RETRY_TOKEN_RATIO) + 2
            for i in range(refills):
                await ingest.get_document(f"ok-{i}")
            with pytest.raises(Unavailable):
                await ingest.get_document("always-again")
    assert servicer.attempts["always-again"] > 1
