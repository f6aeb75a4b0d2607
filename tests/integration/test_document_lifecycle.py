"""The document lifecycle under concurrency, through the real ingest service over gRPC, on the
in-memory fakes (regular suite) and on a real milvus-lite server (slow):

  * a delete during ingestion wins at any moment: the document is gone and no chunk remains;
  * an update during a replacement is refused (ABORTED, DOCUMENT_BUSY), never lost or orphaning
    chunks; a stale etag is refused (ABORTED, ETAG_MISMATCH);
  * a caller that gives up at any moment leaves the ingestion to end by itself: ACTIVE (or
    FAILED), never PROCESSING;
  * admission slots return to zero after uploads cancelled at each await and failed on each path;
  * store writes still running when an attempt is cancelled land before its rollback.

After each: the store invariants the reliability suite checks (no chunk without its ACTIVE
document under its current generation, no document claiming missing chunks, no marker left).
Embedding is slowed down (a sleep per model call) so that an ingestion lasts long enough to be
interrupted at many moments."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf import field_mask_pb2

from ingest_service.app import IngestComponents, build_components, start_ingest_server
from ragrpc.config import Settings
from ragrpc.models import DocumentState
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.store.factory import open_milvus_stores
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc
from tests.support.rpc_details import rpc_details
from tests.support.store_invariants import check_invariants

TENANT = "default"
TEXT = " ".join(f"Sentence {i} says that the heron number {i} waits by the water." for i in range(160))
TEXT_V2 = " ".join(f"Line {i} tells that the crane number {i} flies over the marsh." for i in range(160))


class SlowEmbedder(HashingEmbedder):
    """The hashing embedder with a pause per model call, as a real model has."""

    def __init__(self, pause_s: float) -> None:
        super().__init__(dimension=64)
        self.pause_s = pause_s

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        time.sleep(self.pause_s)
        return super().embed_documents(texts)


@dataclasses.dataclass
class World:
    settings: Settings
    embedder: SlowEmbedder
    chunks: Any
    registry: Any
    ingest: IngestComponents | None = None
    stub: Any = None

    def chunk_rows(self, document_id: str) -> int:
        expr = f.and_(f.eq(s.TENANT, TENANT), f.eq(s.DOCUMENT_ID, document_id))
        return sum(len(page) for page in self.chunks.scan_chunks(expr))

    def assert_consistent(self) -> None:
        report = check_invariants(self.chunks, self.registry, tenant=TENANT)
        assert not report.problems, report.summary() + "\n" + "\n".join(report.problems[:20])


@pytest.fixture(params=["memory", pytest.param("milvus-lite", marks=pytest.mark.slow)])
def stores(request: pytest.FixtureRequest) -> Iterator[World]:
    embedder = SlowEmbedder(pause_s=0.02)
    base = dataclasses.replace(
        Settings(),
        workers=2,
        chunk_size_tokens=40,
        chunk_overlap_tokens=0,
        embedding_call_size=4,
        embedding_batch_size=4,
        sparse_backend="rank_bm25",
        ingest_port=0,
    )
    if request.param == "memory":
        yield World(base, embedder, InMemoryChunkStore(), InMemoryDocumentRegistry())
        return
    milvus_settings: Settings = request.getfixturevalue("milvus_settings")
    settings = dataclasses.replace(
        base, milvus_uri=milvus_settings.milvus_uri, collection_prefix=milvus_settings.collection_prefix
    )
    opened = open_milvus_stores(settings, model_id=embedder.model_id, dimension=embedder.dimension, writer=True)
    yield World(settings, embedder, opened.chunks, opened.registry)


@pytest.fixture
async def world(stores: World) -> AsyncIterator[World]:
    stores.ingest = build_components(stores.settings, stores.embedder, stores.chunks, stores.registry)
    server = await start_ingest_server(stores.settings, stores.ingest, "127.0.0.1:0")
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    stores.stub = ingest_pb2_grpc.IngestServiceStub(channel)
    try:
        yield stores
    finally:
        await channel.close()
        await stores.ingest.stop(5.0)
        await server.stop(0)
        stores.ingest.shutdown()


def _messages(document_id: str, text: str, *, pieces: int = 1) -> list[ingest_pb2.UploadDocumentRequest]:
    data = text.encode()
    step = max(1, len(data) // pieces + 1)
    header = ingest_pb2.DocumentSpec(document_id=document_id, file_name=f"{document_id}.txt")
    return [ingest_pb2.UploadDocumentRequest(header=header)] + [
        ingest_pb2.UploadDocumentRequest(data=data[i : i + step]) for i in range(0, len(data), step)
    ]


async def _upload(world: World, document_id: str, text: str = TEXT, **kwargs: Any) -> Any:
    return await world.stub.UploadDocument(iter(_messages(document_id, text)), **kwargs)


async def _stored_state(world: World, document_id: str) -> Any:
    return await asyncio.to_thread(world.registry.get, TENANT, document_id)


async def _until(predicate: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def _settled(world: World) -> None:
    """Until no ingestion runs and every admission slot is back."""
    assert world.ingest is not None
    ingest = world.ingest

    async def idle() -> bool:
        return ingest.ingestions.running == 0 and ingest.gate.pending == 0

    await _until(idle)


async def _ingestion_time(world: World) -> float:
    started = time.monotonic()
    await _upload(world, "probe")
    elapsed = time.monotonic() - started
    await world.stub.DeleteDocument(ingest_pb2.DeleteDocumentRequest(document_id="probe"))
    return elapsed


# ---- delete during ingestion ---------------------------------------------------------------------


async def test_a_delete_during_ingestion_wins_at_any_moment(world: World) -> None:
    duration = await _ingestion_time(world)
    rng = random.Random(20)
    moments = [0.0, 0.001] + [rng.uniform(0, duration * 1.1) for _ in range(10)]
    outcomes: list[str] = []
    for n, moment in enumerate(moments):
        document_id = f"doc-{n}"
        upload = asyncio.ensure_future(_upload(world, document_id))
        await asyncio.sleep(moment)
        try:
            await world.stub.DeleteDocument(ingest_pb2.DeleteDocumentRequest(document_id=document_id))
            deleted = True
        except grpc.aio.AioRpcError as exc:  # only when the delete came before the upload had arrived
            assert exc.code() == grpc.StatusCode.NOT_FOUND, exc.details()
            deleted = False
        try:
            await upload
            uploaded = "ok"
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.ABORTED, exc.details()
            assert rpc_details(exc)["ErrorInfo"].reason == "DELETED_DURING_INGESTION"
            uploaded = "aborted"
        await _settled(world)
        record = await _stored_state(world, document_id)
        if deleted:
            assert record is None, f"deleted at {moment:.3f}s, the document came back: {record}"
            assert await asyncio.to_thread(world.chunk_rows, document_id) == 0
        else:
            assert record is not None and record.state == DocumentState.ACTIVE
        outcomes.append(f"{'deleted' if deleted else 'not-found'}/{uploaded}")
        world.assert_consistent()
    # the moments reached the ingestion while it ran, not only before or after it
    assert "deleted/aborted" in outcomes, outcomes


async def test_a_delete_during_a_replacement_removes_both_versions(world: World) -> None:
    await _upload(world, "book")
    upload = asyncio.ensure_future(_upload(world, "book", TEXT_V2))

    async def replacing() -> bool:
        record = await _stored_state(world, "book")
        return bool(record and record.pending_generation)

    await _until(replacing)
    await asyncio.sleep(0.05)
    await world.stub.DeleteDocument(ingest_pb2.DeleteDocumentRequest(document_id="book"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await upload
    assert caught.value.code() == grpc.StatusCode.ABORTED
    await _settled(world)
    assert await _stored_state(world, "book") is None
    assert await asyncio.to_thread(world.chunk_rows, "book") == 0
    world.assert_consistent()


# ---- update during ingestion, etags --------------------------------------------------------------


def _update(document_id: str, tags: list[str], etag: str = "") -> ingest_pb2.UpdateDocumentRequest:
    return ingest_pb2.UpdateDocumentRequest(
        document=ingest_pb2.Document(document_id=document_id, tags=tags, etag=etag),
        update_mask=field_mask_pb2.FieldMask(paths=["tags"]),
    )


async def test_an_update_during_a_replacement_is_refused_and_nothing_is_lost(world: World) -> None:
    first = await _upload(world, "atlas")
    upload = asyncio.ensure_future(_upload(world, "atlas", TEXT_V2))

    async def replacing() -> bool:
        record = await _stored_state(world, "atlas")
        return bool(record and record.pending_generation)

    await _until(replacing)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await world.stub.UpdateDocument(_update("atlas", ["maps"]))
    assert caught.value.code() == grpc.StatusCode.ABORTED
    assert rpc_details(caught.value)["ErrorInfo"].reason == "DOCUMENT_BUSY"
    replaced = await upload
    assert replaced.document.state == ingest_pb2.DOCUMENT_STATE_ACTIVE
    assert replaced.document.content_hash != first.document.content_hash
    # the etag read before the replacement is stale now
    with pytest.raises(grpc.aio.AioRpcError) as stale:
        await world.stub.UpdateDocument(_update("atlas", ["maps"], etag=first.document.etag))
    assert stale.value.code() == grpc.StatusCode.ABORTED
    assert rpc_details(stale.value)["ErrorInfo"].reason == "ETAG_MISMATCH"
    current = await world.stub.GetDocument(ingest_pb2.GetDocumentRequest(document_id="atlas"))
    updated = await world.stub.UpdateDocument(_update("atlas", ["maps"], etag=current.document.etag))
    assert list(updated.document.tags) == ["maps"] and updated.document.etag != current.document.etag
    tags = {tuple(c.tags) for page in world.chunks.scan_chunks(f.eq(s.DOCUMENT_ID, "atlas")) for c in page}
    assert tags == {("maps",)}
    world.assert_consistent()


async def test_an_update_without_etag_applies_and_changes_the_etag(world: World) -> None:
    first = await _upload(world, "guide")
    updated = await world.stub.UpdateDocument(_update("guide", ["birds"]))
    assert updated.document.etag and updated.document.etag != first.document.etag
    got = await world.stub.GetDocument(ingest_pb2.GetDocumentRequest(document_id="guide"))
    assert got.document.etag == updated.document.etag


# ---- callers that give up ------------------------------------------------------------------------


async def test_a_caller_that_gives_up_leaves_the_ingestion_to_finish(world: World) -> None:
    duration = await _ingestion_time(world)
    rng = random.Random(21)
    for n in range(8):
        document_id = f"gone-{n}"
        timeout = rng.uniform(0.01, duration * 0.9)
        try:
            await _upload(world, document_id, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED, exc.details()
        await _settled(world)

        async def ended(document_id: str = document_id) -> bool:
            record = await _stored_state(world, document_id)
            return record is None or record.state in (DocumentState.ACTIVE, DocumentState.FAILED)

        await _until(ended)
        record = await _stored_state(world, document_id)
        if record is not None:  # None: the caller gave up before the upload had arrived whole
            assert record.state == DocumentState.ACTIVE, record.error
            got = await world.stub.GetDocument(ingest_pb2.GetDocumentRequest(document_id=document_id))
            assert got.document.chunk_count == await asyncio.to_thread(world.chunk_rows, document_id) > 0
        world.assert_consistent()


async def test_a_cancelled_call_does_not_cancel_the_ingestion(world: World) -> None:
    call = world.stub.UploadDocument(iter(_messages("kept", TEXT)))

    async def started() -> bool:
        return await _stored_state(world, "kept") is not None

    await _until(started)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await _settled(world)
    record = await _stored_state(world, "kept")
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
    await _settled(world)
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
                yield _messages("first", TEXT)[0]
                holding.set()
                await asyncio.sleep(30)

            first = stub.UploadDocument(held_open())
            await holding.wait()
            await _until(lambda: _true_when(stores.ingest.gate.pending == 1))  # type: ignore[union-attr]
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.UploadDocument(iter(_messages("second", TEXT)[:1]))
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert rpc_details(caught.value)["ErrorInfo"].reason == "INGEST_QUEUE_FULL"
            first.cancel()
            await _until(lambda: _true_when(stores.ingest.gate.pending == 0))  # type: ignore[union-attr]
    finally:
        await server.stop(0)
        stores.ingest.shutdown()


async def _true_when(value: bool) -> bool:
    return value


# ---- writes in flight when an attempt is cancelled -----------------------------------------------


async def test_writes_in_flight_land_before_the_rollback(world: World) -> None:
    """A chunk write that is still running in a store thread when a delete cancels the attempt
    finishes first; the rollback and the delete come after it, so no chunk is left behind."""
    release = threading.Event()
    inside = threading.Event()
    real_insert = world.chunks.insert_chunks

    def slow_insert(rows: Any) -> Any:
        inside.set()
        release.wait(10)
        return real_insert(rows)

    world.chunks.insert_chunks = slow_insert
    upload = asyncio.ensure_future(_upload(world, "late"))
    await asyncio.to_thread(inside.wait, 10)
    delete = asyncio.ensure_future(world.stub.DeleteDocument(ingest_pb2.DeleteDocumentRequest(document_id="late")))
    await asyncio.sleep(0.2)
    assert not delete.done(), "the delete must wait for the write in flight"
    release.set()
    await delete
    with pytest.raises(grpc.aio.AioRpcError):
        await upload
    world.chunks.insert_chunks = real_insert
    await _settled(world)
    await asyncio.sleep(0.2)
    assert await _stored_state(world, "late") is None
    assert await asyncio.to_thread(world.chunk_rows, "late") == 0
    world.assert_consistent()


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


# ---- the long version (make test-reliability) ------------------------------------------------------


@pytest.mark.reliability
@pytest.mark.parametrize("stores", [pytest.param("milvus-lite", marks=pytest.mark.slow)], indirect=True)
async def test_a_storm_of_deletes_updates_and_cancellations(world: World) -> None:
    """60 documents, each uploaded (some replaced) while, at a random moment, it is deleted, updated
    or its caller gives up; the store invariants hold after every round and at the end."""
    duration = await _ingestion_time(world)
    rng = random.Random(22)
    for n in range(60):
        document_id = f"storm-{n % 20}"
        action = rng.choice(["delete", "update", "give-up"])
        timeout = rng.uniform(0.01, duration) if action == "give-up" else None
        upload = asyncio.ensure_future(_upload(world, document_id, rng.choice([TEXT, TEXT_V2]), timeout=timeout))
        await asyncio.sleep(rng.uniform(0, duration))
        try:
            if action == "delete":
                await world.stub.DeleteDocument(ingest_pb2.DeleteDocumentRequest(document_id=document_id))
            elif action == "update":
                await world.stub.UpdateDocument(_update(document_id, [f"round-{n}"]))
        except grpc.aio.AioRpcError as exc:
            assert exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.ABORTED), exc.details()
        try:
            await upload
        except grpc.aio.AioRpcError as exc:
            assert exc.code() in (grpc.StatusCode.ABORTED, grpc.StatusCode.DEADLINE_EXCEEDED), exc.details()
        await _settled(world)
        world.assert_consistent()
