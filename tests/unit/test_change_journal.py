"""The writer's change journal (ingest_service.change_journal): each put journals its document after
the row, old entries are purged at most every purge interval, and a failed purge fails nothing."""

from __future__ import annotations

import pytest

from ingest_service.change_journal import JournalledRegistry
from ragrpc.models import DocumentRecord, DocumentState
from ragrpc.testing import InMemoryDocumentRegistry
from ragrpc.testing.faults import ALL_KINDS, FaultKind, FaultPlan, FaultyRegistry


def _record(document_id: str) -> DocumentRecord:
    return DocumentRecord(tenant="t", document_id=document_id, state=DocumentState.ACTIVE, generation="g1")


def _journalled(registry: InMemoryDocumentRegistry) -> dict[str, int]:
    return dict(entry for page in registry.changed_since(0) for entry in page)


def test_a_put_journals_its_document_after_the_row_and_old_entries_are_purged() -> None:
    inner = InMemoryDocumentRegistry()
    counting = FaultPlan.counting()
    clock, wall = [0.0], [1_000_000.0]
    journalled = JournalledRegistry(
        FaultyRegistry(inner, counting),
        keep_s=600,
        purge_every_s=60,
        clock=lambda: clock[0],
        wall_clock=lambda: wall[0],
    )
    journalled.put(_record("a"))
    assert counting.calls == ["registry.put", "registry.journal_changes", "registry.purge_changes"]
    assert set(_journalled(inner)) == {"t/a"}
    journalled.put(_record("b"))
    assert counting.calls[3:] == ["registry.put", "registry.journal_changes"]  # no purge within the interval
    inner.purge_changes(older_than=2**40)
    inner.journal_changes(["t/old"])  # an entry from long ago ...
    inner._changes["t/old"] = 10  # noqa: SLF001 - ... as the journal holds it
    clock[0] += 61
    journalled.put(_record("c"))
    assert counting.calls[-1] == "registry.purge_changes"
    assert set(_journalled(inner)) == {"t/c"}  # the old entry went; the put's own stays
    assert journalled.get("t", "c") is not None  # everything else passes through

    counting.calls.clear()
    journalled.put(DocumentRecord(tenant="t", document_id="new", state=DocumentState.PROCESSING))
    assert counting.calls == ["registry.put"]  # never visible yet: no follower's view changes


@pytest.mark.parametrize("kind", ALL_KINDS, ids=[k.value for k in ALL_KINDS])
def test_a_failed_journal_write_fails_the_put_a_failed_purge_fails_nothing(kind: FaultKind) -> None:
    inner = InMemoryDocumentRegistry()
    journalled = JournalledRegistry(
        FaultyRegistry(inner, FaultPlan.at(1, kind, only=frozenset({"registry.journal_changes"})))
    )
    with pytest.raises(Exception):  # noqa: B017, PT011 - the store error the adapters raise
        journalled.put(_record("a"))
    assert inner.get("t", "a") is not None  # the row was written; its followers find it at their next sweep
    applied = kind in (FaultKind.UNAVAILABLE_AFTER, FaultKind.TIMEOUT)
    assert set(_journalled(inner)) == ({"t/a"} if applied else set())

    purging = JournalledRegistry(
        FaultyRegistry(inner, FaultPlan.at(1, kind, only=frozenset({"registry.purge_changes"})))
    )
    purging.put(_record("b"))  # the purge failed, logged; the put stands
    assert "t/b" in _journalled(inner)


def test_the_setting_turns_the_journal_on_where_filters_scan_and_both_services_follow_it() -> None:
    import dataclasses

    from ingest_service.app import build_components as build_ingest
    from query_service.registry_follower import RegistryFollower
    from ragrpc import errors
    from ragrpc.change_journal import change_journal_enabled
    from ragrpc.config import Settings
    from ragrpc.testing import HashingEmbedder, InMemoryChunkStore

    class EmbeddedStore(InMemoryChunkStore):
        @property
        def embedded(self) -> bool:
            return True  # as milvus-lite's store says of itself

    server_like, embedded = InMemoryChunkStore(), EmbeddedStore()
    auto = Settings()
    assert not change_journal_enabled(auto, server_like) and change_journal_enabled(auto, embedded)
    assert change_journal_enabled(dataclasses.replace(auto, registry_change_journal="on"), server_like)
    assert not change_journal_enabled(dataclasses.replace(auto, registry_change_journal="OFF"), embedded)
    with pytest.raises(errors.PreconditionError, match="RAGRPC_REGISTRY_CHANGE_JOURNAL"):
        change_journal_enabled(dataclasses.replace(auto, registry_change_journal="sometimes"), server_like)

    for choice, journalled in (("on", True), ("off", False)):
        settings = dataclasses.replace(auto, registry_change_journal=choice)
        ingest = build_ingest(settings, HashingEmbedder(), server_like, InMemoryDocumentRegistry())
        assert isinstance(ingest.lifecycle._registry, JournalledRegistry) is journalled  # noqa: SLF001
        ingest.shutdown()

    registry = InMemoryDocumentRegistry()
    plan = FaultPlan.counting()
    follower = RegistryFollower(FaultyRegistry(registry, plan))  # the default: no journal
    follower.load()
    follower.poll()
    follower.poll()
    assert follower.sweeps == 2 and "registry.changed_since" not in plan.calls  # every poll sweeps, as before
