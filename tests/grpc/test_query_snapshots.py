"""A query service that starts from its index snapshot (RAGRPC_INDEX_SNAPSHOT_DIR): after a full load it
writes one; the next start loads it instead of reading the whole collection, catches up with the
registry from the snapshot's watermark (changes made meanwhile, even while the snapshot was being
written, are applied), and only then says SERVING. A snapshot that is corrupt, of another identity or
too old is refused (logged) and the service loads in full."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from query_service import index_snapshot
from query_service.app import (
    QueryComponents,
    build_components,
    embedding_identity,
    start_query_server,
    the_sync,
)
from query_service.snapshot_builder import SnapshotBuilder, build_snapshot
from ragrpc.config import Settings
from ragrpc.testing.faults import FaultPlan, FaultyChunkStore
from ragrpc.testing.invariants import check_query_view
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc, retrieve_pb2, retrieve_pb2_grpc
from tests.conftest import FakeStack, running_stack


def text(word: str) -> bytes:
    return " ".join(f"Entry {i}: the {word} number {i} rests on the {word} rock." for i in range(12)).encode()


async def upload(stack: FakeStack, document_id: str, word: str) -> None:
    async with grpc.aio.insecure_channel(stack.ingest_address) as channel:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        header = ingest_pb2.DocumentSpec(document_id=document_id, file_name=f"{document_id}.txt")
        await stub.UploadDocument(
            iter([ingest_pb2.UploadDocumentRequest(header=header), ingest_pb2.UploadDocumentRequest(data=text(word))])
        )


async def delete(stack: FakeStack, document_id: str) -> None:
    async with grpc.aio.insecure_channel(stack.ingest_address) as channel:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        await stub.DeleteDocument(ingest_pb2.DeleteDocumentRequest(document_id=document_id))


class QueryReplica:
    """A query service on the shared stores, its chunk reads counted; `builder`: what runs the full load of a
    start without a snapshot (the service's main gives it a child process)."""

    def __init__(self, settings: Settings, stores: FakeStack, builder: SnapshotBuilder | None = None) -> None:
        self.settings = settings
        chunk_reads = frozenset({"chunks.scan_chunks", "chunks.get_chunks"})
        self.reads = FaultyChunkStore(stores.chunks, FaultPlan.counting(only=chunk_reads))
        self.components: QueryComponents = build_components(
            settings, stores.embedder, self.reads, stores.registry, load=False
        )
        self.components.snapshot_builder = builder
        self.registry = stores.registry

    async def __aenter__(self) -> QueryReplica:
        self.server = await start_query_server(self.settings, self.components, "127.0.0.1:0")
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.server.port}")
        self.stub = retrieve_pb2_grpc.RetrieveServiceStub(self.channel)
        components = self.components
        for _ in range(1000):  # until SERVING (after a full load: once the first snapshot is written)
            written = components.snapshots is None or components.restored or components.snapshots.saved
            if components.follower.ready and written:
                break
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()
        await self.server.stop(0)
        self.components.executor.shutdown(wait=False)

    async def found(self, words: str) -> set[str]:
        request = retrieve_pb2.RetrieveRequest(
            query=words, options=retrieve_pb2.RetrievalOptions(top_k=20, mode=retrieve_pb2.RETRIEVAL_MODE_SPARSE)
        )
        return {r.chunk.chunk.document_id async for r in self.stub.Retrieve(request) if r.HasField("chunk")}

    def problems(self) -> list[str]:
        sync = the_sync(self.components)
        return check_query_view(self.components.follower, self.registry, {"index": sync}).problems


@pytest.fixture
async def snapshot_stack(
    settings: Settings, fake_stores: FakeStack, tmp_path: Path
) -> AsyncIterator[tuple[Settings, FakeStack]]:
    with_snapshots = dataclasses.replace(
        settings, index_snapshot_dir=str(tmp_path / "snapshots"), registry_follow_interval_s=3600.0
    )
    async with running_stack(with_snapshots, fake_stores) as stack:
        yield with_snapshots, stack


def replica(settings: Settings, stack: FakeStack) -> QueryReplica:
    return QueryReplica(settings, stack)


async def test_a_replica_starts_from_the_snapshot_and_catches_up_with_changes_since(snapshot_stack: Any) -> None:
    settings, stack = snapshot_stack
    for i, word in enumerate(("heron", "crane", "ibis", "stork")):
        await upload(stack, f"doc-{i}", word)
    async with replica(settings, stack) as first:
        assert not first.components.restored and first.components.snapshots.saved == 1
        assert first.reads.plan.calls  # the full load read the chunks
    await upload(stack, "doc-4", "egret")  # new
    await upload(stack, "doc-1", "plover")  # replaced
    await delete(stack, "doc-2")  # deleted
    async with replica(settings, stack) as second:
        assert second.components.restored and second.components.follower.ready
        assert second.problems() == []
        # only the changed documents' chunks were read, by their ids in one call, not the collection
        assert second.reads.plan.calls == ["chunks.get_chunks"]
        assert await second.found("egret") == {"doc-4"}
        assert await second.found("plover") == {"doc-1"} and await second.found("crane") == set()
        assert await second.found("ibis") == set()


async def test_a_change_made_while_the_snapshot_is_written_is_not_lost(
    snapshot_stack: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, stack = snapshot_stack
    await upload(stack, "doc-0", "heron")
    real_save = index_snapshot.save_snapshot
    wrote: list[str] = []

    def save_after_a_change(*args: Any, **kwargs: Any) -> Path:
        # the indexes and the watermark were captured; the ingest service writes before they are saved
        asyncio.run_coroutine_threadsafe(upload(stack, "late", "godwit"), loop).result(30)
        wrote.append("late")
        return real_save(*args, **kwargs)

    loop = asyncio.get_running_loop()
    monkeypatch.setattr(index_snapshot, "save_snapshot", save_after_a_change)
    async with replica(settings, stack) as first:
        assert wrote == ["late"] and first.components.snapshots.saved == 1
    monkeypatch.setattr(index_snapshot, "save_snapshot", real_save)
    async with replica(settings, stack) as second:
        assert second.components.restored
        assert await second.found("godwit") == {"late"} and second.problems() == []


@pytest.mark.parametrize("spoil", ["corrupt", "other identity", "too old"])
async def test_an_unusable_snapshot_is_refused_and_the_replica_loads_in_full(
    snapshot_stack: Any, spoil: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings, stack = snapshot_stack
    await upload(stack, "doc-0", "heron")
    async with replica(settings, stack):
        pass
    root = Path(settings.index_snapshot_dir)
    current = root / (root / "CURRENT").read_text().strip()
    if spoil == "corrupt":
        arrays = current / "arrays.bin"
        data = bytearray(arrays.read_bytes())
        data[len(data) // 2] ^= 0xFF
        arrays.write_bytes(bytes(data))
    elif spoil == "other identity":
        settings = dataclasses.replace(settings, bm25_k1=1.2)
    else:
        settings = dataclasses.replace(settings, index_snapshot_max_age_s=0.0)
    async with replica(settings, stack) as second:
        assert not second.components.restored and second.components.follower.ready
        assert await second.found("heron") == {"doc-0"} and second.problems() == []
    assert "not used" in caplog.text and "load in full" in caplog.text


async def test_without_a_snapshot_directory_nothing_is_written(settings: Settings, fake_stores: FakeStack) -> None:
    async with running_stack(settings, fake_stores) as stack:
        await upload(stack, "doc-0", "heron")
        async with replica(settings, stack) as only:
            assert only.components.snapshots is None and not only.components.restored


class BuildElsewhere:
    """The build process's work (`build_snapshot`: its own follower and indexes, a full load, the snapshot) on
    the same stores, without the process; then `after` (a change made after the snapshot's watermark, or a
    spoiled snapshot); answers `result`."""

    def __init__(self, settings: Settings, stack: FakeStack, after: Any = None, result: bool = True) -> None:
        self.settings, self.stack, self.after, self.result = settings, stack, after, result
        self.reads = FaultyChunkStore(stack.chunks, FaultPlan.counting(only=frozenset({"chunks.scan_chunks"})))
        self.built: list[Path] = []

    async def build(self) -> bool:
        identity = embedding_identity(self.stack.embedder)
        self.built.append(await build_snapshot(self.settings, self.reads, self.stack.registry, identity))
        if self.after is not None:
            await self.after()
        return self.result


async def test_a_first_start_has_its_snapshot_built_elsewhere_then_starts_from_it(snapshot_stack: Any) -> None:
    """The full load runs in the builder (the service's main: a child process); the service loads the snapshot
    it wrote and catches up from its watermark (a document ingested after it is found), reading no more than
    that document's chunks itself."""
    settings, stack = snapshot_stack
    for i, word in enumerate(("heron", "crane", "ibis")):
        await upload(stack, f"doc-{i}", word)
    builder = BuildElsewhere(settings, stack, after=lambda: upload(stack, "late", "godwit"))
    async with QueryReplica(settings, stack, builder) as first:
        assert len(builder.built) == 1 and builder.reads.plan.calls, "the builder loaded the collection in full"
        assert first.components.restored and first.components.follower.ready
        assert first.reads.plan.calls == ["chunks.get_chunks"], "the service read the late document's chunks only"
        assert first.components.snapshots.saved == 0, "no second snapshot of the same view"
        assert await first.found("heron") == {"doc-0"} and await first.found("godwit") == {"late"}
        assert first.problems() == []
        await upload(stack, "doc-1", "plover")  # the adopted indexes take changes as usual
        await asyncio.to_thread(first.components.follower.poll)
        assert await first.found("plover") == {"doc-1"} and await first.found("crane") == set()
        assert first.problems() == []


@pytest.mark.parametrize("failure", ["the build failed", "its snapshot is corrupt"])
async def test_a_build_that_fails_or_leaves_no_usable_snapshot_costs_the_full_load_here(
    snapshot_stack: Any, failure: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings, stack = snapshot_stack
    await upload(stack, "doc-0", "heron")

    async def spoil() -> None:
        root = Path(settings.index_snapshot_dir)
        arrays = root / (root / "CURRENT").read_text().strip() / "arrays.bin"
        data = bytearray(arrays.read_bytes())
        data[len(data) // 2] ^= 0xFF
        arrays.write_bytes(bytes(data))

    if failure == "the build failed":
        builder = BuildElsewhere(settings, stack, result=False)
    else:
        builder = BuildElsewhere(settings, stack, after=spoil)
    async with QueryReplica(settings, stack, builder) as replica:
        assert len(builder.built) == 1 and not replica.components.restored and replica.components.follower.ready
        assert "chunks.scan_chunks" in replica.reads.plan.calls, "the service loaded in full itself"
        assert replica.components.snapshots.saved == 1, "and wrote its own first snapshot"
        assert await replica.found("heron") == {"doc-0"} and replica.problems() == []
    if failure != "the build failed":
        assert "not used" in caplog.text
