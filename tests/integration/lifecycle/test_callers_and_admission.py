"""Callers that give up and the admission gate, through the real ingest service over gRPC, on the
in-memory fakes (regular suite) and on a real milvus-lite server (slow):

  * a caller that gives up at any moment leaves the ingestion to end by itself: ACTIVE (or
    FAILED), never PROCESSING;
  * admission slots return to zero after uploads cancelled at each await and failed on each path,
    and a busy service refuses as soon as the header arrives;
  * a failed document of a batch carries a google.rpc.Status.

After each: the store invariants the reliability suite checks."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import AsyncIterator

import grpc
import pytest

from ingest_service.app import build_components, start_ingest_server
from ragrpc.models import DocumentState
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc
from tests.support.lifecycle import (
    TEXT,
    World,
    ingestion_time,
    settled,
    stored_state,
    true_when,
    until,
    upload_document,
    upload_messages,
)
from tests.support.rpc_details import rpc_details

# ---- callers that give up ------------------------------------------------------------------------


async def test_a_caller_that_gives_up_leaves_the_ingestion_to_finish(world: World) -> None:
    duration = await ingestion_time(world)
    rng = random.Random(21)
    for n in range(8):
        document_id = f"gone-{n}"
        timeout = rng.uniform(0.01, duration * 0.9)
        try:
            await upload_document(world, document_id, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED, exc.details()
        await settled(world)

        async def ended(document_id: str = document_id) -> bool:
            record = await stored_state(world, document_id)
            return record is None or record.state in (DocumentState.ACTIVE, DocumentState.FAILED)

        await until(ended)
        record = await stored_state(world, document_id)
        if record is not None:  # None: the caller gave up before the upload had arrived whole
            assert record.state == DocumentState.ACTIVE, record.error
            got = await world.stub.GetDocument(ingest_pb2.GetDocumentRequest(document_id=document_id))
            assert got.document.chunk_count == await asyncio.to_thread(world.chunk_rows, document_id) > 0
        world.assert_consistent()


async def test_a_cancelled_call_does_not_cancel_the_ingestion(world: World) -> None:
    call = world.stub.UploadDocument(iter(upload_messages("kept", TEXT)))

    async def started() -> bool:
        return await stored_state(world, "kept") is not None

    await until(started)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await settled(world)
    record = await stored_state(world, "kept")
    assert record is not None and record.state == DocumentState.ACTIVE
    world.assert_consistent()


# ---- admission ---------------------------------------------------------------------------------


async def test_admission_slots_come_back_after_cancellations_and_failures(world: World) -> None:
    assert world.ingest is not None
    header = ingest_pb2.DocumentSpec(document_id="adm", file_name="adm.txt")
    data = TEXT.encode()

    async def cancelled_after(messages: list[ingest_pb2.UploadDocumentRequest], hold: bool) -> None:
        """Sends `messages`, keeps the stream open when `hold`, then cancels the call."""
        sent = asyncio.Event()

        async def requests() -> AsyncIterator[ingest_pb2.UploadDocumentRequest]:
            for message in messages:
                yield message
            sent.set()
            if hold:
                await asyncio.sleep(30)

        call = world.stub.UploadDocument(requests())
        await sent.wait()
        await asyncio.sleep(0.05)
        call.cancel()
        with pytest.raises((asyncio.CancelledError, grpc.aio.AioRpcError)):
            await call

    header_only = [ingest_pb2.UploadDocumentRequest(header=header)]
    some_data = header_only + [ingest_pb2.UploadDocumentRequest(data=data[:100])]
    everything = header_only + [ingest_pb2.UploadDocumentRequest(data=data)]
    for _ in range(3):
        await cancelled_after([], hold=True)  # nothing sent
        await cancelled_after(header_only, hold=True)  # cancelled while waiting for data
        await cancelled_after(some_data, hold=True)  # cancelled half-way through the body
        await cancelled_after(everything, hold=False)  # cancelled during the ingestion
    failing = [
        [ingest_pb2.UploadDocumentRequest(data=b"x")],  # data before the header
        [ingest_pb2.UploadDocumentRequest(header=ingest_pb2.DocumentSpec(document_id="adm"))],  # no file name
        header_only + header_only,  # two headers
        header_only + [ingest_pb2.UploadDocumentRequest(data=b"\x00\x01\x02\xff" * 64)],  # not a document
    ]
    for messages in failing:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await world.stub.UploadDocument(iter(messages))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    stream = world.stub.IngestDocuments(
        ingest_pb2.IngestDocumentsRequest(
            documents=[ingest_pb2.InlineDocument(spec=header, content=data) for _ in range(3)]
        )
    )
    stream.cancel()
    await settled(world)
    assert world.ingest.gate.pending == 0
    world.assert_consistent()


async def test_a_busy_service_refuses_when_the_header_arrives(stores: World) -> None:
    stores.settings = dataclasses.replace(stores.settings, max_pending_documents=1)
    stores.ingest = build_components(stores.settings, stores.embedder, stores.chunks, stores.registry)
    server = await start_ingest_server(stores.settings, stores.ingest, "127.0.0.1:0")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = ingest_pb2_grpc.IngestServiceStub(channel)
            holding = asyncio.Event()

            async def held_open() -> AsyncIterator[ingest_pb2.UploadDocumentRequest]:
                yield upload_messages("first", TEXT)[0]
                holding.set()
                await asyncio.sleep(30)

            first = stub.UploadDocument(held_open())
            await holding.wait()
            await until(lambda: true_when(stores.ingest.gate.pending == 1))  # type: ignore[union-attr]
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.UploadDocument(iter(upload_messages("second", TEXT)[:1]))
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert rpc_details(caught.value)["ErrorInfo"].reason == "INGEST_QUEUE_FULL"
            first.cancel()
            await until(lambda: true_when(stores.ingest.gate.pending == 0))  # type: ignore[union-attr]
    finally:
        await server.stop(0)
        stores.ingest.shutdown()


# ---- per-document errors as google.rpc.Status ----------------------------------------------------


async def test_a_failed_document_of_a_batch_carries_a_google_rpc_status(world: World) -> None:
    from google.rpc import code_pb2, error_details_pb2

    good = ingest_pb2.InlineDocument(
        spec=ingest_pb2.DocumentSpec(document_id="good", file_name="good.txt"), content=TEXT.encode()
    )
    binary = ingest_pb2.InlineDocument(
        spec=ingest_pb2.DocumentSpec(document_id="binary", file_name="binary.txt"), content=bytes(range(256)) * 64
    )
    finals = {}
    async for message in world.stub.IngestDocuments(ingest_pb2.IngestDocumentsRequest(documents=[good, binary])):
        if message.HasField("progress") and message.progress.stage == ingest_pb2.INGEST_STAGE_DONE:
            finals[message.progress.document_id] = message.progress
    assert not finals["good"].HasField("status")
    status = finals["binary"].status
    assert status.code == code_pb2.INVALID_ARGUMENT and status.message == finals["binary"].error_message
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info) and info.reason == "UNSUPPORTED_MEDIA_TYPE" and info.domain == "ragrpc.v1"
    # and the same from the job record, afterwards
    job_id = message.job_id
    job = await world.stub.GetIngestJob(ingest_pb2.GetIngestJobRequest(job_id=job_id))
    [stored] = [d for d in job.job.documents if d.document_id == "binary"]
    assert stored.status.code == code_pb2.INVALID_ARGUMENT
