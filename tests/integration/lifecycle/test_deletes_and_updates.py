"""Deletes and updates racing an ingestion, through the real ingest service over gRPC, on the
in-memory fakes (regular suite) and on a real milvus-lite server (slow):

  * a delete during ingestion wins at any moment: the document is gone and no chunk remains;
  * a delete during a replacement removes both versions;
  * an update during a replacement is refused (ABORTED, DOCUMENT_BUSY), never lost or orphaning
    chunks; a stale etag is refused (ABORTED, ETAG_MISMATCH);
  * store writes still running when an attempt is cancelled land before its rollback.

After each: the store invariants the reliability suite checks (no chunk without its ACTIVE
document under its current generation, no document claiming missing chunks, no marker left)."""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Any

import grpc
import pytest

from ragrpc.models import DocumentState
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.v1 import ingest_pb2
from tests.support.lifecycle import (
    TEXT,
    TEXT_V2,
    World,
    ingestion_time,
    settled,
    stored_state,
    until,
    update_request,
    upload_document,
)
from tests.support.rpc_details import rpc_details

# ---- delete during ingestion ---------------------------------------------------------------------


async def test_a_delete_during_ingestion_wins_at_any_moment(world: World) -> None:
    duration = await ingestion_time(world)
    rng = random.Random(20)
    moments = [0.0, 0.001] + [rng.uniform(0, duration * 1.1) for _ in range(10)]
    outcomes: list[str] = []
    for n, moment in enumerate(moments):
        document_id = f"doc-{n}"
        upload = asyncio.ensure_future(upload_document(world, document_id))
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
        await settled(world)
        record = await stored_state(world, document_id)
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
    await upload_document(world, "book")
    upload = asyncio.ensure_future(upload_document(world, "book", TEXT_V2))

    async def replacing() -> bool:
        record = await stored_state(world, "book")
        return bool(record and record.pending_generation)

    await until(replacing)
    await asyncio.sleep(0.05)
    await world.stub.DeleteDocument(ingest_pb2.DeleteDocumentRequest(document_id="book"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await upload
    assert caught.value.code() == grpc.StatusCode.ABORTED
    await settled(world)
    assert await stored_state(world, "book") is None
    assert await asyncio.to_thread(world.chunk_rows, "book") == 0
    world.assert_consistent()


# ---- update during ingestion, etags --------------------------------------------------------------


async def test_an_update_during_a_replacement_is_refused_and_nothing_is_lost(world: World) -> None:
    first = await upload_document(world, "atlas")
    upload = asyncio.ensure_future(upload_document(world, "atlas", TEXT_V2))

    async def replacing() -> bool:
        record = await stored_state(world, "atlas")
        return bool(record and record.pending_generation)

    await until(replacing)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await world.stub.UpdateDocument(update_request("atlas", ["maps"]))
    assert caught.value.code() == grpc.StatusCode.ABORTED
    assert rpc_details(caught.value)["ErrorInfo"].reason == "DOCUMENT_BUSY"
    replaced = await upload
    assert replaced.document.state == ingest_pb2.DOCUMENT_STATE_ACTIVE
    assert replaced.document.content_hash != first.document.content_hash
    # the etag read before the replacement is stale now
    with pytest.raises(grpc.aio.AioRpcError) as stale:
        await world.stub.UpdateDocument(update_request("atlas", ["maps"], etag=first.document.etag))
    assert stale.value.code() == grpc.StatusCode.ABORTED
    assert rpc_details(stale.value)["ErrorInfo"].reason == "ETAG_MISMATCH"
    current = await world.stub.GetDocument(ingest_pb2.GetDocumentRequest(document_id="atlas"))
    updated = await world.stub.UpdateDocument(update_request("atlas", ["maps"], etag=current.document.etag))
    assert list(updated.document.tags) == ["maps"] and updated.document.etag != current.document.etag
    tags = {tuple(c.tags) for page in world.chunks.scan_chunks(f.eq(s.DOCUMENT_ID, "atlas")) for c in page}
    assert tags == {("maps",)}
    world.assert_consistent()


async def test_an_update_without_etag_applies_and_changes_the_etag(world: World) -> None:
    first = await upload_document(world, "guide")
    updated = await world.stub.UpdateDocument(update_request("guide", ["birds"]))
    assert updated.document.etag and updated.document.etag != first.document.etag
    got = await world.stub.GetDocument(ingest_pb2.GetDocumentRequest(document_id="guide"))
    assert got.document.etag == updated.document.etag


# ---- callers that give up ------------------------------------------------------------------------


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
    upload = asyncio.ensure_future(upload_document(world, "late"))
    await asyncio.to_thread(inside.wait, 10)
    delete = asyncio.ensure_future(world.stub.DeleteDocument(ingest_pb2.DeleteDocumentRequest(document_id="late")))
    await asyncio.sleep(0.2)
    assert not delete.done(), "the delete must wait for the write in flight"
    release.set()
    await delete
    with pytest.raises(grpc.aio.AioRpcError):
        await upload
    world.chunks.insert_chunks = real_insert
    await settled(world)
    await asyncio.sleep(0.2)
    assert await stored_state(world, "late") is None
    assert await asyncio.to_thread(world.chunk_rows, "late") == 0
    world.assert_consistent()


# ---- per-document errors as google.rpc.Status ----------------------------------------------------


@pytest.mark.reliability
@pytest.mark.parametrize("stores", [pytest.param("milvus-lite", marks=pytest.mark.slow)], indirect=True)
async def test_a_storm_of_deletes_updates_and_cancellations(world: World) -> None:
    """60 documents, each uploaded (some replaced) while, at a random moment, it is deleted, updated
    or its caller gives up; the store invariants hold after every round and at the end."""
    duration = await ingestion_time(world)
    rng = random.Random(22)
    for n in range(60):
        document_id = f"storm-{n % 20}"
        action = rng.choice(["delete", "update", "give-up"])
        timeout = rng.uniform(0.01, duration) if action == "give-up" else None
        upload = asyncio.ensure_future(
            upload_document(world, document_id, rng.choice([TEXT, TEXT_V2]), timeout=timeout)
        )
        await asyncio.sleep(rng.uniform(0, duration))
        try:
            if action == "delete":
                await world.stub.DeleteDocument(ingest_pb2.DeleteDocumentRequest(document_id=document_id))
            elif action == "update":
                await world.stub.UpdateDocument(update_request(document_id, [f"round-{n}"]))
        except grpc.aio.AioRpcError as exc:
            assert exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.ABORTED), exc.details()
        try:
            await upload
        except grpc.aio.AioRpcError as exc:
            assert exc.code() in (grpc.StatusCode.ABORTED, grpc.StatusCode.DEADLINE_EXCEEDED), exc.details()
        await settled(world)
        world.assert_consistent()
