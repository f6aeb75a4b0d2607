"""The defects issue 43 reproduced, one test each (each failed on the code before the fix):

1. a replacement whose commit fails is forgotten (the record took the new hash; a retry was `unchanged`);
2. a failed reload leaves a hole in the query service's indexes while it says it is ready;
3. a malformed upload takes an admission slot for ever;
4. a writer whose lease expired keeps writing after a second process took the lease over.
(5, read your writes, is tests/grpc/test_read_your_writes.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import grpc
import numpy as np
import pytest

from ingest_service.app import build_components, start_ingest_server
from ingest_service.recovery import recover_documents
from ingest_service.writer_lease import WriterLease
from query_service.dense_index import InProcessDenseIndex
from query_service.index_sync import ChunkIndexSync
from query_service.registry_follower import RegistryFollower
from query_service.sparse_index import InProcessBm25Index
from ragrpc.analyzer import EnglishAnalyzer
from ragrpc.config import Settings
from ragrpc.models import DocumentState
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry
from ragrpc.testing.faults import FaultKind, FaultPlan, FaultyChunkStore
from ragrpc.testing.invariants import check_query_view, check_store
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc
from tests.faults.rig import CONTENTS, V1, V2, IngestRig, content_hash, upload_messages
from tests.support.rpc_details import rpc_details


async def test_1_a_replacement_whose_commit_fails_keeps_the_old_record_and_a_retry_ingests_it(rig: IngestRig) -> None:
    rig.reset()
    assert (await rig.upload("doc", V1)).ok
    await rig.settled()
    counting = FaultPlan.counting(only=frozenset({"registry.put"}))
    rig.arm(counting)
    assert (await rig.upload("doc", V2)).ok
    # a replacement's registry writes: begin (1), the switch (2); then, after the grace period, the
    # replaced version's marker cleared (3)
    await rig.settled()
    assert len(counting.calls) == 3
    rig.reset()
    assert (await rig.upload("doc", V1)).ok
    await rig.settled()
    before = rig.stored("doc")
    rig.arm(FaultPlan.at(2, FaultKind.UNAVAILABLE_BEFORE, only=frozenset({"registry.put"})))
    failed = await rig.upload("doc", V2)
    assert failed.code is grpc.StatusCode.UNAVAILABLE
    rig.plan.clear()
    await rig.settled()
    after = rig.stored("doc")
    assert after.state == DocumentState.ACTIVE and after.generation == before.generation
    assert (after.content_hash, after.title, after.chunk_count) == (
        before.content_hash,
        before.title,
        before.chunk_count,
    )
    again = await rig.upload("doc", V2)  # what the client library does on UNAVAILABLE
    assert again.ok and not again.response.unchanged and again.response.document.content_hash == content_hash(V2)
    await rig.settled()
    check_store(rig.chunks.inner, rig.registry.inner, contents=CONTENTS, settled=True).assert_ok()


def follower_over(chunks: Any, registry: Any) -> tuple[RegistryFollower, ChunkIndexSync]:
    follower = RegistryFollower(registry)
    sync = ChunkIndexSync(InProcessBm25Index(EnglishAnalyzer()), chunks, dense=InProcessDenseIndex(32))
    follower.add_listener(sync)
    return follower, sync


async def test_2_a_reload_that_fails_once_leaves_no_hole(rig: IngestRig) -> None:
    rig.reset()
    assert (await rig.upload("doc", V1)).ok
    await rig.settled()
    registry = rig.registry.inner
    reads = FaultyChunkStore(rig.chunks.inner, FaultPlan.counting())
    follower, sync = follower_over(reads, registry)
    follower.load()
    assert (await rig.upload("doc", V2)).ok
    chunk_reads = frozenset({"chunks.scan_chunks", "chunks.get_chunks"})
    reads.plan = FaultPlan.at(1, FaultKind.UNAVAILABLE_BEFORE, only=chunk_reads)
    with pytest.raises(Exception):  # noqa: B017, PT011 - the chunk read fails; the loop polls again
        follower.poll()
    assert sync.index.chunk_count("default") > 0, "the previous version stays in the indexes meanwhile"
    follower.poll()  # the next poll, the store answering again
    new = registry.get("default", "doc")
    found = [chunk_id for chunk_id, _ in sync.index.search("crane marsh", 20, tenant="default")]
    assert {c.generation for c in rig.chunks.inner.get_chunks(found)} == {new.generation}, "a hole"
    assert sync.index.chunk_count("default") == new.chunk_count
    assert follower.lagging == 0  # (while it lagged, it said so: tests/faults/test_query_faults.py)
    assert not check_query_view(follower, registry, {"indexes": sync}).problems


async def test_3_malformed_uploads_give_back_their_admission_slots(rig: IngestRig) -> None:
    rig.reset()
    assert rig.components is not None
    limit = rig.settings.max_pending_documents
    header = ingest_pb2.DocumentSpec(
        document_id="bad", file_name="bad.txt", chunking=ingest_pb2.ChunkingOptions(strategy=4242)
    )
    refusals = []
    for _ in range(limit + 3):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await rig.stub.UploadDocument(
                iter([ingest_pb2.UploadDocumentRequest(header=header), ingest_pb2.UploadDocumentRequest(data=b"x")])
            )
        refusals.append(refused.value)
    assert rig.components.gate.pending == 0
    assert (await rig.upload("good", V1)).ok
    assert {error.code() for error in refusals} == {grpc.StatusCode.INVALID_ARGUMENT}
    assert "unknown chunking strategy" in (refusals[0].details() or "")
    violations = rpc_details(refusals[0])["BadRequest"].field_violations
    assert [v.field for v in violations] == ["header.chunking.strategy"]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class PausingEmbedder(HashingEmbedder):
    """Holds its first model call until `resume` is set: a writer paused in the middle of a document."""

    def __init__(self) -> None:
        super().__init__(dimension=32)
        self.entered = threading.Event()
        self.resume = threading.Event()

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        self.entered.set()
        self.resume.wait(30)
        return super().embed_documents(texts)


async def test_4_a_paused_writer_whose_lease_expired_never_overwrites_the_next_holder() -> None:
    chunks, registry, clock = InMemoryChunkStore(), InMemoryDocumentRegistry(), Clock()
    settings = dataclasses.replace(
        Settings(), workers=2, chunk_size_tokens=40, chunk_overlap_tokens=0, embedding_call_size=64, ingest_port=0
    )

    async def writer(lease: WriterLease, embedder: HashingEmbedder) -> tuple[Any, Any, Any]:
        components = build_components(settings, embedder, chunks, registry, lease=lease, settle_delays_s=(0.01,))
        server = await start_ingest_server(settings, components, "127.0.0.1:0")
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
        return components, server, channel

    first_lease = WriterLease(registry, ttl_s=30, settle_s=0, clock=clock, host="a", pid=1)
    first_lease.acquire()
    paused = PausingEmbedder()
    first, first_server, first_channel = await writer(first_lease, paused)
    stub = ingest_pb2_grpc.IngestServiceStub(first_channel)
    upload = asyncio.ensure_future(stub.UploadDocument(iter(upload_messages("doc", V1))))
    await asyncio.to_thread(paused.entered.wait, 10)  # the first writer is in the middle of the document
    clock.now += 31  # it stalls past its lease
    second_lease = WriterLease(registry, ttl_s=30, settle_s=0, clock=clock, host="b", pid=2)
    second_lease.acquire()  # the second process takes the expired lease over
    recover_documents(registry, chunks)  # its recovery rolls the first one's attempt back
    second, second_server, second_channel = await writer(second_lease, HashingEmbedder(dimension=32))
    second_stub = ingest_pb2_grpc.IngestServiceStub(second_channel)
    await second_stub.UploadDocument(iter(upload_messages("doc", V2)))
    state = registry.get("default", "doc")
    assert state.state == DocumentState.ACTIVE and state.content_hash == content_hash(V2)
    paused.resume.set()  # the first writer wakes up and goes on with the document
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await upload
    assert refused.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION)
    await asyncio.sleep(0.2)  # its rollback and background settling try to write too
    assert registry.get("default", "doc") == state, "the first writer overwrote the second's record"
    check_store(chunks, registry, contents=CONTENTS).assert_ok()
    first_lease.renew()  # its renewal finds the other holder: lost for good
    assert first_lease.lost_reason
    for components, server, channel in ((first, first_server, first_channel), (second, second_server, second_channel)):
        await channel.close()
        await components.stop(1.0)
        await server.stop(0)
        components.shutdown()
