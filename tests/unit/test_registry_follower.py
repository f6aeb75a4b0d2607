"""The query service's RegistryFollower: visible generations in memory, changes applied in
batches, deletes through the journal (also when the key is ingested again), the key-listing
backstop, and a watermark that never skips a row changed behind a running page scan."""

from __future__ import annotations

import pytest

from ingest_service.change_journal import JournalledRegistry
from query_service.packed_table import PackedTable
from query_service.registry_follower import VIEW_CODEC, DocumentChange, DocumentView, RegistryFollower
from ragrpc.models import DocumentRecord, DocumentState
from ragrpc.testing import InMemoryDocumentRegistry


class Recorder:
    def __init__(self) -> None:
        self.loaded: list[DocumentView] = []
        self.finished = 0
        self.batches: list[list[DocumentChange]] = []

    def documents_loaded(self, documents: list[DocumentView]) -> None:
        self.loaded += documents

    def load_finished(self) -> None:
        self.finished += 1

    def documents_changed(self, changes: list[DocumentChange]) -> None:
        self.batches.append(changes)


def _put(registry: InMemoryDocumentRegistry, document_id: str, generation: str = "g1", **fields) -> DocumentRecord:  # type: ignore[no-untyped-def]
    record = DocumentRecord(
        tenant="t", document_id=document_id, collection="c", state=DocumentState.ACTIVE, generation=generation
    )
    for name, value in fields.items():
        setattr(record, name, value)
    JournalledRegistry(registry).put(record)  # as the ingest service writes it: the row, then the journal
    return record


def _follower(registry: InMemoryDocumentRegistry, **kwargs) -> tuple[RegistryFollower, Recorder]:  # type: ignore[no-untyped-def]
    follower = RegistryFollower(registry, **{"change_journal": True, **kwargs})  # _put journals, as the writer
    recorder = Recorder()
    follower.add_listener(recorder)
    return follower, recorder


def test_load_pages_through_every_visible_document() -> None:
    registry = InMemoryDocumentRegistry(page_size=3)
    for i in range(10):
        _put(registry, f"d{i}")
    _put(registry, "failed", state=DocumentState.FAILED)
    _put(registry, "going", deleting=True)
    follower, recorder = _follower(registry)
    assert follower.load() == 10 and recorder.finished == 1 and len(recorder.loaded) == 10
    assert follower.generations(["t/d3", "t/failed", "t/going", "t/none"]) == {"t/d3": "g1"}
    # nothing incoming: a query may show the visible generation alone
    assert follower.lagging == 0
    assert follower.accepted(["t/d3", "t/failed", "t/none", "t/d4"]) == {"t/d3": ("g1",), "t/d4": ("g1",)}


def test_changes_arrive_in_one_batch_per_poll() -> None:
    registry = InMemoryDocumentRegistry(page_size=2)
    _put(registry, "a")
    _put(registry, "b")
    follower, recorder = _follower(registry)
    follower.load()
    assert follower.poll() == 0 and recorder.batches == []  # rows within the clock slack, unchanged
    _put(registry, "a", generation="g2")  # replaced
    _put(registry, "b", tags=["new"])  # same generation, new chunk fields
    _put(registry, "c")  # new
    assert follower.poll() == 3 and len(recorder.batches) == 1
    assert {c.document_id: c.now.generation for c in recorder.batches[0] if c.now} == {"a": "g2", "b": "g1", "c": "g1"}
    assert follower.poll() == 0  # re-read within the slack, nothing new


def test_deletes_come_through_the_journal_and_a_new_ingest_wins() -> None:
    registry = InMemoryDocumentRegistry()
    for name in ("a", "b"):
        _put(registry, name)
    follower, recorder = _follower(registry)
    follower.load()
    registry.delete("t", "a")
    registry.delete("t", "b")
    _put(registry, "b", generation="g9")  # ingested again right after its delete
    follower.poll()
    assert follower.generations(["t/a", "t/b"]) == {"t/b": "g9"}
    assert [(c.document_id, c.now) for c in recorder.batches[0] if c.now is None] == [("a", None)]


def test_the_key_listing_catches_a_delete_whose_journal_entry_is_gone() -> None:
    registry = InMemoryDocumentRegistry()
    _put(registry, "a")
    follower, _ = _follower(registry)
    follower.load()
    registry.delete("t", "a")
    registry.purge_deletions(older_than=2**40)
    registry.purge_changes(older_than=2**40)  # (its creation's entry would name it: its row is gone)
    follower.poll()
    assert follower.generations(["t/a"]) == {"t/a": "g1"}  # not seen yet...
    follower.poll(reconcile=True)
    assert follower.generations(["t/a"]) == {}  # ...until the backstop listing


def test_the_watermark_never_passes_the_start_of_a_scan() -> None:
    """A row written behind a running page scan with an updated_at older than the newest row the
    scan saw must still be picked up by the next poll."""
    registry = InMemoryDocumentRegistry()
    now = [1_000_000.0]
    follower, _ = _follower(registry, wall_clock=lambda: now[0])
    late = _put(registry, "late")
    late.updated_at = 2_000_000  # a row from a clock far ahead
    registry._docs[late.key] = late
    follower.load()
    behind = _put(registry, "behind")  # written during the scan, stamped "now" by the ingest process
    behind.updated_at = 1_000_001
    registry._docs[behind.key] = behind
    follower.poll()
    assert follower.generations(["t/behind"]) == {"t/behind": "g1"}


class CountingRegistry(InMemoryDocumentRegistry):
    """Counts the listings of every key (the reconcile backstop)."""

    def __init__(self) -> None:
        super().__init__()
        self.key_listings = 0

    def scan_keys(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.key_listings += 1
        return super().scan_keys(*args, **kwargs)


def _restored_from(registry: InMemoryDocumentRegistry, *, age_s: float) -> RegistryFollower:
    """A follower restored from the view of a follower that loaded `registry` `age_s` ago."""
    import time

    source, _ = _follower(registry)
    source.load()
    state, arrays, watermark = source.export_state()
    follower, _ = _follower(registry, wall_clock=lambda: time.time() + age_s)
    follower.restore(state, PackedTable.restore(VIEW_CODEC, arrays), watermark)
    return follower


def test_a_restored_view_catches_up_from_the_journal_without_listing_every_key() -> None:
    """Start from a snapshot younger than the journal's retention: the first poll reads the changes and
    the journal since the watermark, applies a delete made after the snapshot, and lists no keys (that
    listing of a million keys took 37 s of a start on a Milvus server); the listing comes later, at its
    interval."""
    registry = CountingRegistry()
    for name in ("a", "b"):
        _put(registry, name)
    follower = _restored_from(registry, age_s=3600)
    registry.delete("t", "a")
    _put(registry, "c")
    assert not follower.ready
    follower.poll()
    assert follower.ready and registry.key_listings == 0
    assert follower.generations(["t/a", "t/b", "t/c"]) == {"t/b": "g1", "t/c": "g1"}


def test_a_restored_view_older_than_the_journal_lists_every_key_at_its_first_poll() -> None:
    """A snapshot within a day of the journal's retention (7 days): deletes since it may be purged from
    the journal, so the first poll also lists every key and drops what is gone."""
    registry = CountingRegistry()
    _put(registry, "a")
    follower = _restored_from(registry, age_s=6.5 * 24 * 3600)
    registry.delete("t", "a")
    registry.purge_deletions(older_than=2**40)
    follower.poll()
    assert registry.key_listings == 1 and follower.ready
    assert follower.generations(["t/a"]) == {}


def test_a_follower_sweeps_at_its_interval_and_first_after_a_restore() -> None:
    """The sweep runs every sweep_interval_s (not at every poll: on milvus-lite it scans the registry)."""
    clock = [0.0]
    registry = InMemoryDocumentRegistry()
    follower = RegistryFollower(registry, sweep_interval_s=30.0, change_journal=True, clock=lambda: clock[0])
    follower.load()
    for _ in range(5):
        clock[0] += 5.0
        follower.poll()
    assert follower.sweeps == 0 and follower.polls == 5
    clock[0] += 6.0
    follower.poll()
    assert follower.sweeps == 1
    state, visible, watermark = follower.export_state()
    restored = RegistryFollower(registry, sweep_interval_s=30.0, change_journal=True, clock=lambda: clock[0])
    restored.restore(state, PackedTable(VIEW_CODEC), watermark)
    restored.poll()
    assert restored.sweeps == 1  # changes since the snapshot's watermark: swept, not trusted to the journal


def test_journalled_changes_past_one_read_by_key_all_arrive(monkeypatch: pytest.MonkeyPatch) -> None:
    from query_service import registry_follower

    monkeypatch.setattr(registry_follower, "_KEY_READ_BATCH", 2)
    registry = InMemoryDocumentRegistry(page_size=3)
    follower, recorder = _follower(registry)
    follower.load()
    for i in range(7):
        _put(registry, f"d{i}")
    assert follower.poll() == 7 and sorted(c.document_id for c in recorder.batches[0]) == [f"d{i}" for i in range(7)]
