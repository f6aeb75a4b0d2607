"""Async calls the real-server tests make through gRPC stubs: upload one document (header, then its
bytes), retrieve and keep the chunks and the summary, and wait until a read returns what is expected."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc, retrieve_pb2, retrieve_pb2_grpc


async def upload_document(stub: ingest_pb2_grpc.IngestServiceStub, content: bytes, **spec: Any) -> ingest_pb2.Document:
    async def messages():  # type: ignore[no-untyped-def]
        yield ingest_pb2.UploadDocumentRequest(header=ingest_pb2.DocumentSpec(**spec))
        yield ingest_pb2.UploadDocumentRequest(data=content)

    return (await stub.UploadDocument(messages(), timeout=120)).document


async def retrieve_chunks(
    stub: retrieve_pb2_grpc.RetrieveServiceStub, query: str, **options: Any
) -> tuple[list[Any], Any]:
    responses = [
        r
        async for r in stub.Retrieve(
            retrieve_pb2.RetrieveRequest(query=query, options=retrieve_pb2.RetrievalOptions(**options)), timeout=60
        )
    ]
    return [r.chunk for r in responses if r.HasField("chunk")], responses[-1].summary


async def eventually(read: Callable[[], Awaitable[Any]], expected: Any, timeout_s: float = 10.0) -> Any:
    """The first value of `read()` equal to `expected`, trying every 100 ms; the last value after timeout_s."""
    deadline = time.monotonic() + timeout_s
    value = await read()
    while value != expected and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        value = await read()
    return value
