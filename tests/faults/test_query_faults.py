"""Every store call of the query service's registry follower fails once, with every failure class:
its start-up load, a poll that applies replacements, updates, deletes and new documents, and a
poll that replays the deletion journal. Once the fault clears, the follower's visible documents
and both in-process indexes equal the registry within a few polls, and until then the service says
so (ready False at start, `lagging` otherwise), never a silent hole. A store that returns a
document's chunks short (a Milvus server read that lags the writer) keeps the previous version
visible until it returns them all; during a replacement a query finds the old or the new version,
never neither."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc
import pytest

from query_service.dense_index import InProcessDenseIndex
from query_service.index_sync import ChunkIndexSync
from query_service.registry_follower import RegistryFollower
from query_service.sparse_index import InProcessBm25Index
from ragrpc.analyzer import EnglishAnalyzer
from ragrpc.testing import InMemoryChunkStore, InMemoryDocumentRegistry
from ragrpc.testing.faults import ALL_KINDS, FaultPlan, FaultyChunkStore, FaultyRegistry, fault_matrix
from ragrpc.testing.invariants import check_query_view
from ragrpc.v1 import ingest_pb2
from tests.faults.rig import OTHERS, V1, V2, IngestRig, call

PAGE = 2  # rows per page: every scan of these tests takes several pages, and can fail after the first


@dataclasses.dataclass
class QueryView:
    """The query service's follower and indexes over the shared stores, behind their own fault plan."""

    chunks: FaultyChunkStore
    registry: FaultyRegistry
    follower: RegistryFollower
    sync: ChunkIndexSync

    @classmethod
    def over(cls, chunks: Any, registry: Any, plan: FaultPlan, *, give_up_after_s: float = 60.0) -> QueryView:
        faulty_chunks, faulty_registry = FaultyChunkStore(chunks, plan), FaultyRegistry(registry, plan)
        # the rig's writer journals (registry_change_journal="on"): so does this reader
        follower = RegistryFollower(faulty_registry, give_up_after_s=give_up_after_s, change_journal=True)
        sync = ChunkIndexSync(InProcessBm25Index(EnglishAnalyzer()), faulty_chunks, dense=InProcessDenseIndex(32))
        follower.add_listener(sync)
        return cls(faulty_chunks, faulty_registry, follower, sync)

    def arm(self, plan: FaultPlan) -> None:
        self.chunks.plan = self.registry.plan = plan

    def problems(self, registry: Any) -> list[str]:
        return check_query_view(self.follower, registry, {"indexes": self.sync}).problems


@pytest.fixture
async def rig() -> AsyncIterator[IngestRig]:
    def paged(keep: bool) -> tuple[Any, Any]:
        return InMemoryChunkStore(page_size=PAGE), InMemoryDocumentRegistry(page_size=PAGE)

    started = await IngestRig.start(make_stores=paged)
    try:
        yield started
    finally:
        await started.stop()


async def populated(rig: IngestRig) -> None:
    rig.reset()
    for name, text in {"doc": V1, **OTHERS}.items():
        assert (await rig.upload(name, text)).ok
    await rig.settled()


async def changed(rig: IngestRig) -> None:
    """A replacement, a metadata update, a delete and a new document, all after the view loaded."""
    assert (await rig.upload("doc", V2)).ok
    update = ingest_pb2.UpdateDocumentRequest(
        document=ingest_pb2.Document(document_id="ibis", tags=["renamed"]),
        update_mask={"paths": ["tags"]},
    )
    assert (await call(lambda: rig.stub.UpdateDocument(update))).ok
    assert (await call(lambda: rig.stub.DeleteDocument(ingest_pb2.DeleteDocumentRequest(document_id="stork")))).ok
    assert (await rig.upload("late", V1)).ok
    await rig.settled()


async def deleted_many(rig: IngestRig) -> None:
    for name in OTHERS:
        request = ingest_pb2.DeleteDocumentRequest(document_id=name)
        assert (await call(lambda request=request: rig.stub.DeleteDocument(request))).ok
    await rig.settled()


def converges(view: QueryView, registry: Any, polls: int = 3) -> list[str]:
    """What a user sees once the fault cleared: the background loop polls again."""
    for _ in range(polls):
        try:
            view.follower.poll()
        except Exception:  # noqa: BLE001 - the next poll tries again
            continue
        if not view.problems(registry) and view.follower.lagging == 0:
            return []
    return view.problems(registry) + [f"{view.follower.lagging} change(s) still lagging"]


async def run_poll_matrix(
    rig: IngestRig, change: Callable[[IngestRig], Any], *, reconcile: bool = False, sweep: bool = False
) -> list[str]:
    await populated(rig)
    counting = FaultPlan.counting()
    view = QueryView.over(rig.chunks.inner, rig.registry.inner, counting)
    view.follower.load()
    await change(rig)
    start = len(counting.calls)
    view.follower.poll(reconcile=reconcile, sweep=sweep)
    assert not view.problems(rig.registry.inner)
    calls = counting.calls[start:]
    violations: list[str] = []
    runs = list(fault_matrix(calls, ALL_KINDS))
    print(f"\npoll after {change.__name__}: {len(calls)} store calls, {len(runs)} runs")
    for number, name, kind in runs:
        await populated(rig)
        view = QueryView.over(rig.chunks.inner, rig.registry.inner, FaultPlan.counting())
        view.follower.load()
        await change(rig)
        plan = FaultPlan.at(number, kind)
        view.arm(plan)
        try:
            view.follower.poll(reconcile=reconcile, sweep=sweep)
        except Exception:  # noqa: BLE001 - a failed poll is retried by its supervised loop
            pass
        plan.clear()
        for problem in converges(view, rig.registry.inner):
            violations.append(f"poll call {number} ({name}) {kind.value}: {problem}")
    return violations


async def test_every_store_call_of_a_poll_fails_once(rig: IngestRig) -> None:
    violations = await run_poll_matrix(rig, changed)
    assert not violations, "\n".join(violations[:25])


async def test_every_store_call_of_a_sweeping_poll_fails_once(rig: IngestRig) -> None:
    """A poll that also sweeps the registry (every RAGRPC_REGISTRY_SWEEP_INTERVAL_S, and the first
    after a start): its scan of the changed rows besides the change journal."""
    violations = await run_poll_matrix(rig, changed, sweep=True)
    assert not violations, "\n".join(violations[:25])


async def changed_despite_faults(rig: IngestRig) -> None:
    """`changed`'s writes, each answered however the fault left it."""
    await rig.upload("doc", V2)
    update = ingest_pb2.UpdateDocumentRequest(
        document=ingest_pb2.Document(document_id="ibis", tags=["renamed"]),
        update_mask={"paths": ["tags"]},
    )
    await call(lambda: rig.stub.UpdateDocument(update))
    await call(lambda: rig.stub.DeleteDocument(ingest_pb2.DeleteDocumentRequest(document_id="stork")))
    await rig.upload("late", V1)
    await rig.settled()


async def test_a_change_whose_journal_write_failed_reaches_a_follower_at_its_next_sweep(rig: IngestRig) -> None:
    """The writer journals each put after the registry row (ingest_service.change_journal). For every
    journal write of `changed` and every failure class: a follower loaded before the changes, polling
    the journal, shows what the registry holds once it has swept the registry, never later."""
    journal = frozenset({"registry.journal_changes"})
    await populated(rig)
    counting = FaultPlan.counting(only=journal)
    rig.arm(counting)
    await changed(rig)
    writes = len(counting.calls)
    assert writes >= 4
    violations: list[str] = []
    missed_until_the_sweep = 0
    for number in range(1, writes + 1):
        for kind in ALL_KINDS:
            await populated(rig)
            view = QueryView.over(rig.chunks.inner, rig.registry.inner, FaultPlan.counting())
            view.follower.load()
            plan = FaultPlan.at(number, kind, only=journal)
            rig.arm(plan)
            await changed_despite_faults(rig)
            plan.clear()
            rig.arm(FaultPlan.counting())
            view.follower.poll()  # the journal alone
            if view.problems(rig.registry.inner):
                missed_until_the_sweep += 1
            view.follower.poll(sweep=True)
            for problem in view.problems(rig.registry.inner):
                violations.append(f"journal write {number} {kind.value}: after the sweep: {problem}")
    # (the lifecycle writes the document again after a failed put, journalled: the journal alone
    # usually catches up; the sweep is for a writer that stopped between the row and its entry)
    print(f"\n{writes} journal writes, {writes * len(ALL_KINDS)} runs, {missed_until_the_sweep} seen only by the sweep")
    assert not violations, "\n".join(violations[:25])


async def test_changes_a_writer_never_journalled_reach_a_follower_at_its_next_sweep(rig: IngestRig) -> None:
    """A writer that stopped after each registry write, before its journal entry (as if `changed`'s
    every entry were lost): the journal-reading polls do not see the changes, the sweep does."""
    await populated(rig)
    view = QueryView.over(rig.chunks.inner, rig.registry.inner, FaultPlan.counting())
    view.follower.load()
    await changed(rig)
    rig.registry.inner.purge_changes(older_than=2**40)
    view.follower.poll()
    missed = view.problems(rig.registry.inner)
    assert missed, "without journal entries, the journal-reading poll cannot know"
    assert view.follower.sweeps == 0
    view.follower.poll(sweep=True)
    assert view.follower.sweeps == 1 and not view.problems(rig.registry.inner)


async def test_every_store_call_of_a_journal_replay_fails_once(rig: IngestRig) -> None:
    violations = await run_poll_matrix(rig, deleted_many)
    assert not violations, "\n".join(violations[:25])


async def test_every_store_call_of_a_reconciling_poll_fails_once(rig: IngestRig) -> None:
    async def purged(rig: IngestRig) -> None:
        await deleted_many(rig)
        rig.registry.inner.purge_deletions(older_than=2**40)  # the follower was away longer than the journal

    violations = await run_poll_matrix(rig, purged, reconcile=True)
    assert not violations, "\n".join(violations[:25])


async def test_every_store_call_of_the_start_up_load_fails_once(rig: IngestRig) -> None:
    await populated(rig)
    counting = FaultPlan.counting()
    QueryView.over(rig.chunks.inner, rig.registry.inner, counting).follower.load()
    violations = []
    runs = list(fault_matrix(list(counting.calls), ALL_KINDS))
    print(f"\nstart-up load: {len(counting.calls)} store calls, {len(runs)} runs")
    for number, name, kind in runs:
        plan = FaultPlan.at(number, kind)
        view = QueryView.over(rig.chunks.inner, rig.registry.inner, plan)
        try:
            view.follower.load()
        except Exception:  # noqa: BLE001 - the service stays NOT_SERVING and loads again
            assert not view.follower.ready
            plan.clear()
            view.follower.load()
        plan.clear()
        if not view.follower.ready:
            violations.append(f"load call {number} ({name}) {kind.value}: not ready after a clean load")
        for problem in view.problems(rig.registry.inner):
            violations.append(f"load call {number} ({name}) {kind.value}: {problem}")
    assert not violations, "\n".join(violations[:25])


class LaggingReads:
    """A chunk store whose reads (scans and reads by key) miss the last chunk of the newest generations
    for a while, as a Milvus server's reads may miss rows written a moment ago (Session/Bounded
    consistency)."""

    def __init__(self, inner: Any, generations: set[str]) -> None:
        self.inner = inner
        self.hidden = set(generations)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def scan_chunks(self, expr: Any, *args: Any, **kwargs: Any) -> Iterator[list[Any]]:
        kept = self._lagging([chunk for page in self.inner.scan_chunks(expr, *args, **kwargs) for chunk in page])
        if kept:
            yield kept

    def get_chunks(self, chunk_ids: list[str], *args: Any, **kwargs: Any) -> list[Any]:
        return self._lagging(self.inner.get_chunks(chunk_ids, *args, **kwargs))

    def _lagging(self, rows: list[Any]) -> list[Any]:
        last: dict[str, tuple[int, str]] = {}
        for chunk in rows:
            if chunk.generation in self.hidden:
                last[chunk.generation] = max(last.get(chunk.generation, (-1, "")), (chunk.chunk_index, chunk.chunk_id))
        return [chunk for chunk in rows if last.get(chunk.generation, (0, ""))[1] != chunk.chunk_id]


async def test_a_short_read_after_a_replacement_keeps_the_old_version_until_the_store_returns_all(
    rig: IngestRig,
) -> None:
    await populated(rig)
    registry = rig.registry.inner
    lagging = LaggingReads(rig.chunks.inner, set())
    view = QueryView.over(lagging, registry, FaultPlan.counting())
    view.follower.load()
    old = registry.get("default", "doc")
    assert (await rig.upload("doc", V2)).ok
    new = registry.get("default", "doc")
    lagging.hidden.add(new.generation)
    view.follower.poll()
    assert view.follower.lagging == 1, "a short read must not be accepted"
    assert view.follower.generations(["default/doc"]) == {"default/doc": old.generation}
    assert view.follower.accepted(["default/doc"]) == {"default/doc": (old.generation, new.generation)}
    assert view.sync.documents()["default/doc"] == (old.generation, old.chunk_count)
    view.follower.poll()
    assert view.follower.lagging == 1  # tried again, still short
    lagging.hidden.clear()
    view.follower.poll()
    assert view.follower.lagging == 0 and not view.problems(registry)


async def test_a_start_up_load_with_a_short_document_is_not_ready_until_it_is_complete(rig: IngestRig) -> None:
    await populated(rig)
    registry = rig.registry.inner
    lagging = LaggingReads(rig.chunks.inner, {registry.get("default", "ibis").generation})
    view = QueryView.over(lagging, registry, FaultPlan.counting())
    view.follower.load()
    assert view.follower.loaded and not view.follower.ready
    assert "default/ibis" not in view.follower.visible_generations()
    lagging.hidden.clear()
    view.follower.poll()
    assert view.follower.ready and not view.problems(registry)


async def test_a_document_short_for_good_is_given_up_on_with_an_error_logged(
    rig: IngestRig, caplog: pytest.LogCaptureFixture
) -> None:
    await populated(rig)
    registry = rig.registry.inner
    lagging = LaggingReads(rig.chunks.inner, {registry.get("default", "ibis").generation})
    view = QueryView.over(lagging, registry, FaultPlan.counting(), give_up_after_s=0.0)
    view.follower.load()
    assert not view.follower.ready
    view.follower.poll()
    assert view.follower.ready and view.follower.lagging == 0
    assert "fewer than the registry counts" in caplog.text


async def test_during_a_replacement_queries_find_the_old_or_the_new_version_never_neither(settings: Any) -> None:
    """Through a real query service over the stores (dense search in the store, BM25 in process): at
    every moment of a replacement - committed but not yet polled, polled with the chunk read failing,
    polled - the document is found, by each retriever alone and fused, in one version. The replaced
    version's rows stay readable for the grace period (RAGRPC_REPLACED_VERSION_GRACE_S)."""
    rig = await IngestRig.start(replaced_grace_s=30.0)
    from query_service.app import build_components, start_query_server
    from ragrpc.testing import HashingEmbedder
    from ragrpc.v1 import retrieve_pb2, retrieve_pb2_grpc

    await populated(rig)
    chunks = FaultyChunkStore(rig.chunks.inner, FaultPlan.counting())
    registry = FaultyRegistry(rig.registry.inner, FaultPlan.counting())
    query_settings = dataclasses.replace(settings, dense_search="store", registry_follow_interval_s=3600.0)
    components = build_components(query_settings, HashingEmbedder(dimension=32), chunks, registry)
    server = await start_query_server(query_settings, components, "127.0.0.1:0")
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    stub = retrieve_pb2_grpc.RetrieveServiceStub(channel)
    follower = components.follower

    async def found_everywhere() -> None:
        for mode in (
            retrieve_pb2.RETRIEVAL_MODE_DENSE,
            retrieve_pb2.RETRIEVAL_MODE_SPARSE,
            retrieve_pb2.RETRIEVAL_MODE_HYBRID,
        ):
            request = retrieve_pb2.RetrieveRequest(
                query="which number waits by the water", options=retrieve_pb2.RetrievalOptions(top_k=50, mode=mode)
            )
            hits = [r.chunk.chunk async for r in stub.Retrieve(request) if r.HasField("chunk")]
            texts = [h.text for h in hits if h.document_id == "doc"]
            assert texts, f"mode {mode}: the document is found in neither version"
            versions = {"v1" if "heron" in text else "v2" if "crane" in text else "?" for text in texts}
            assert len(versions) == 1 and "?" not in versions, f"mode {mode}: versions mixed: {versions}"

    try:
        await found_everywhere()
        assert (await rig.upload("doc", V2)).ok  # committed, the old rows deleted; not polled yet
        await found_everywhere()
        reads = frozenset({"chunks.scan_chunks", "chunks.get_chunks"})
        for _ in range(2):  # the registry read passes, the chunk read fails: the change stays incoming
            chunks.plan = FaultPlan(only=reads, rate=1.0, kinds=(ALL_KINDS[0],))
            with pytest.raises(Exception):  # noqa: B017, PT011 - the poll fails; its loop tries again
                follower.poll()
        chunks.plan = FaultPlan.counting()  # queries read the hits' rows by key
        assert follower.lagging == 1
        await found_everywhere()
        chunks.plan = FaultPlan.counting()
        follower.poll()
        assert follower.lagging == 0
        await found_everywhere()
    finally:
        await channel.close()
        await server.stop(0)
        components.executor.shutdown(wait=False)
        await rig.stop()
