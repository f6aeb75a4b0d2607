"""The query service's view of the document registry, followed in the background.

The ingest service (another process) writes the registry; this class keeps, in memory, which
version of every document is visible (ACTIVE, not being deleted: its generation, chunk count and
the document-level fields copied onto its chunks). It answers the retrieval pipeline's
visibility check without a store call, and has its listeners (the in-process BM25 and dense
indexes, through ChunkIndexSync) apply what changed, in batches.

    load()  -> one paged scan of the registry's ACTIVE rows (before the service reports SERVING)
    poll()  -> the change journal since the last poll (the writer journals each document it puts,
               ingest_service.change_journal, where RAGRPC_REGISTRY_CHANGE_JOURNAL has it; a read of a
               few rows; without the journal every poll sweeps) with those documents' rows read
               by key, and the deletion journal since then (a delete removes the registry row, so
               the journal is how a follower learns of it), applied as one batch; every
               `sweep_interval_s` (and at least 20x the last sweep's time), and at the first poll,
               instead of trusting the change journal alone, also the rows whose updated_at passed
               the sweep's watermark (one paged query: milvus-lite scans the registry for it, 1.2 s
               at 1M documents), the backstop for a change whose journal write failed; every
               `reconcile_interval_s` (and at least 20x the last listing's time) also a paged
               listing of all keys, a backstop for deletion-journal entries purged while this
               process was away

A change is visible only once every listener has applied it. One that a listener could not apply
(its chunk read failed, or returned fewer chunks than the registry counts: a store that lags its
own writes) stays *incoming*: the previous version stays visible and in the indexes, the change
is tried again at every poll, `lagging` counts it (a gauge, and a log line at each try), and the
visibility check accepts the incoming generation too, so that a query finds the old or the new
version of a document being replaced, never neither. A change still incoming after
`give_up_after_s` is applied with the chunks the store returns, logged as an error. A start-up
load that left documents incoming keeps `ready` False (health NOT_SERVING) until they are applied.

`applied_through` is the registry position the view reflects: every registry write made before
it (by the writer's clock, within the clock slack) is applied. Read-your-writes waits on it
(query_service.consistency).

Nothing here runs on the request path: a supervised loop calls poll() every
RAGRPC_REGISTRY_FOLLOW_INTERVAL_S off the event loop (and read-your-writes asks for one sooner).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from query_service.packed_table import PackedTable
from ragrpc.consistency import chunk_fields, is_visible, version_digest
from ragrpc.models import DocumentRecord, DocumentState, document_key
from ragrpc.store import schema as s
from ragrpc.store.base import DocumentRegistry
from ragrpc.store.filters import FilterBuilder

logger = logging.getLogger(__name__)

_REGISTRY = FilterBuilder(s.REGISTRY_FILTERABLE_FIELDS)
_CLOCK_SLACK_S = 2  # updated_at has 1 s resolution and the clocks of two processes differ
_RECONCILE_COST_FACTOR = 20  # reconcile (and sweep) at most 1/20 of the time
_KEY_READ_BATCH = 1024  # registry rows in one read by key
_JOURNAL_MARGIN_S = 24 * 3600  # a snapshot this close to the journal's retention lists every key at start


@dataclass(frozen=True)
class DocumentView:
    """What the query service needs of a visible document."""

    tenant: str
    document_id: str
    generation: str
    fields: tuple  # title, tags, metadata as copied onto the chunks
    chunk_count: int = 0  # retrievable chunks of the generation, as the registry counts them
    # the generation's chunk indexes 0 .. chunk_span-1, read by their derived ids (ragrpc.models.chunk_id_for;
    # 0: not recorded). How to read the chunks, not what queries see: not compared.
    chunk_span: int = field(default=0, compare=False)

    @property
    def key(self) -> str:
        return document_key(self.tenant, self.document_id)

    @property
    def version(self) -> str:
        return version_digest(self.generation, self.fields)


@dataclass(frozen=True)
class DocumentChange:
    """A document whose visible generation or chunk fields changed; `now` None: no longer visible.
    `accept_short`: apply it with the chunks the store returns even when fewer than the registry
    counts (the follower gave up waiting for the rest)."""

    tenant: str
    document_id: str
    now: DocumentView | None
    accept_short: bool = False

    @property
    def key(self) -> str:
        return document_key(self.tenant, self.document_id)


class RegistryListener(Protocol):
    def documents_loaded(self, documents: list[DocumentView]) -> None:
        """One page of the start-up load."""
        ...

    def load_finished(self) -> Collection[str] | None:
        """The start-up load is complete (the listener may now read what it needs of the documents);
        returns the keys of the documents it could not load completely (None: all of them)."""
        ...

    def documents_changed(self, changes: list[DocumentChange]) -> Collection[str] | None:
        """Applies the changes; returns the keys of those it could not apply (None: all applied).
        Raising leaves every change of the batch to be tried again."""
        ...


def view_of(record: DocumentRecord) -> DocumentView | None:
    if not is_visible(record):
        return None
    return DocumentView(
        record.tenant,
        record.document_id,
        record.generation,
        chunk_fields(record),
        record.chunk_count,
        record.chunk_span,
    )


class RegistryFollower:
    def __init__(
        self,
        registry: DocumentRegistry,
        *,
        reconcile_interval_s: float = 60.0,
        sweep_interval_s: float = 30.0,
        change_journal: bool = False,
        give_up_after_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._registry = registry
        self._reconcile_interval = reconcile_interval_s
        self._sweep_interval = sweep_interval_s
        self._change_journal = change_journal  # the writer keeps one (False: every poll sweeps)
        self._give_up_after = give_up_after_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._visible: PackedTable[DocumentView] = PackedTable(VIEW_CODEC)  # key -> the version queries see
        self._incoming: dict[str, DocumentView | None] = {}  # seen in the registry, not applied yet
        self._lagging_since: dict[str, float] = {}  # key -> when its change first failed to apply
        self._listeners: list[RegistryListener] = []
        self._watermark = 0  # registry updated_at seen so far by the load and the sweeps
        self._journal_mark = 0  # change-journal time seen so far
        self._journal_read_at = 0.0  # wall time of the last poll that read the change journal
        self._next_sweep = float("-inf")  # the first poll sweeps
        self.sweeps = 0
        self._next_reconcile = float("inf")
        self._reconcile_due = False
        self._lock = threading.Lock()  # one load/poll at a time; readers need no lock (dict reads)
        self._start_incomplete = False
        self.applied_through = 0.0  # registry writes before this wall time are applied (see the docstring)
        self.loaded = False
        self.polls = 0

    def add_listener(self, listener: RegistryListener) -> None:
        self._listeners.append(listener)

    @property
    def listeners(self) -> tuple[RegistryListener, ...]:
        return tuple(self._listeners)

    # ---- reads (any thread, no lock) ----------------------------------------------------------------

    def generations(self, keys: Iterable[str]) -> dict[str, str]:
        """The visible generation of each of these document keys that is visible."""
        visible = self._visible
        return {key: generation for key in keys if (generation := visible.generation(key)) is not None}

    def accepted(self, keys: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """The generations a query may show of each key, oldest first: the visible one and, while a
        change is incoming, the registry's newer one (see the module docstring)."""
        visible, incoming = self._visible, self._incoming
        if not incoming:  # nothing being applied (the usual case): the visible generation alone
            return {key: (generation,) for key, generation in visible.generations_of(keys).items()}
        found: dict[str, tuple[str, ...]] = {}
        for key in keys:
            current, newer = visible.generation(key), incoming.get(key)
            generations = tuple(g for g in (current, newer.generation if newer else None) if g is not None)
            if generations:
                found[key] = tuple(dict.fromkeys(generations))
        return found

    def knows(self, key: str) -> bool:
        """Whether the follower has seen the document (visible, or a change of it incoming)."""
        return key in self._visible or key in self._incoming

    def version_of(self, key: str) -> str:
        """The version queries show of the document (ragrpc.consistency.document_version), "" for none."""
        view = self._visible.get(key)
        return view.version if view is not None else ""

    def visible_generations(self) -> dict[str, str]:
        return self._visible.generations()

    @property
    def lagging(self) -> int:
        """Changes seen in the registry that the indexes could not apply yet."""
        return len(self._incoming)

    @property
    def ready(self) -> bool:
        return self.loaded and not self._start_incomplete

    @property
    def document_count(self) -> int:
        return len(self._visible)

    # ---- a snapshot of the view (query_service.index_snapshot) -----------------------------------

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No load or poll runs meanwhile: the view and the indexes stay as they are (a snapshot is
        taken of both under it)."""
        with self._lock:
            yield

    def export_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray], int]:
        """The view as JSON-serialisable data (the few changes incoming), arrays (every visible
        document, packed) and the registry watermark it reflects (call it `paused`)."""
        state = {
            "incoming": [[key, _view_row(view) if view is not None else None] for key, view in self._incoming.items()],
            "applied_through": self.applied_through,
        }
        return state, self._visible.export(), self._watermark

    def restore(self, state: dict[str, Any], visible: PackedTable[DocumentView], watermark: int) -> None:
        """Starts from a snapshot's view instead of `load()`: the next polls follow the registry from
        the watermark; the follower is ready once a poll has applied everything since the snapshot.
        The deletion journal holds every delete since a watermark younger than its retention
        (schema.DELETION_JOURNAL_KEEP_S, less a day of margin), so the listing of every key (the
        backstop, 37 s at 1M documents on a Milvus server) runs at its usual interval after the
        start; for an older watermark the first poll lists every key too."""
        journal_covers = self._wall_clock() - int(watermark) < s.DELETION_JOURNAL_KEEP_S - _JOURNAL_MARGIN_S
        with self._lock:
            self._visible = visible
            self._incoming = {key: _view_of_row(row) if row is not None else None for key, row in state["incoming"]}
            self._lagging_since = dict.fromkeys(self._incoming, self._clock())
            self._watermark = self._journal_mark = int(watermark)
            self._next_sweep = float("-inf")  # the first poll sweeps from the snapshot's watermark
            self.applied_through = float(state.get("applied_through", 0.0))
            self._reconcile_due = not journal_covers
            self._start_incomplete = True  # until a poll has caught up with the registry
            self.loaded = True
            self._schedule_reconcile(0.0)

    # ---- load and poll (one at a time, off the event loop) -----------------------------------------

    def load(self) -> int:
        """Every visible document, page by page; listeners get each page as it arrives."""
        with self._lock:
            started, wall = self._clock(), self._wall_clock()
            pages = seen = 0
            loading: PackedTable[DocumentView] = PackedTable(VIEW_CODEC)
            for page in self._registry.scan(_REGISTRY.eq(s.STATE, int(DocumentState.ACTIVE))):
                views = [view for record in page if (view := view_of(record)) is not None]
                for view in views:
                    loading[view.key] = view
                seen = max([seen, *(record.updated_at for record in page)])
                for listener in self._listeners:
                    listener.documents_loaded(views)
                pages += 1
                if pages % 10 == 0:
                    logger.info("registry: %d documents loaded", len(loading))
            short: set[str] = set()
            for listener in self._listeners:
                short.update(listener.load_finished() or ())
            for key in [key for key in short if key in loading]:
                self._incoming[key] = loading.get(key)
                self._lagging_since.setdefault(key, self._clock())
                loading.pop(key)
            self._visible.update(loading)
            if short:
                self._start_incomplete = True
                logger.warning(
                    "start-up load: %d document(s) not loaded completely (e.g. %s); NOT_SERVING until they are",
                    len(short),
                    ", ".join(sorted(short)[:5]),
                )
            else:
                self.applied_through = max(self.applied_through, wall - _CLOCK_SLACK_S)
            self._advance_watermark(seen, int(wall))
            self._journal_mark = max(self._journal_mark, self._watermark)
            self._journal_read_at = wall
            self._next_sweep = self._clock() + self._sweep_interval
            self.loaded = True
            self._schedule_reconcile(self._clock() - started)
            return len(self._visible)

    def _advance_watermark(self, seen: int, wall_at_start: int) -> None:
        """A page scan runs in key order, so a row changed behind it during the scan is not in it: the
        next poll starts from when this one started (or the newest row seen, if older), not later."""
        self._watermark = max(self._watermark, min(seen, wall_at_start))

    def poll(self, *, reconcile: bool = False, sweep: bool = False) -> int:
        """Applies registry changes since the last poll, and the incoming ones left from earlier
        polls; returns how many documents changed. `sweep`: read the registry's changed rows too,
        whether or not the sweep is due."""
        with self._lock:
            if reconcile or self._clock() >= self._next_reconcile:
                self._reconcile_due = True  # until a listing completes: a failed poll leaves it due
            wall = self._wall_clock()
            # the journal may have lost entries written since the last read (a process paused longer
            # than half the journal's retention): sweep too
            behind = wall - self._journal_read_at > s.CHANGE_JOURNAL_KEEP_S / 2
            sweeping = sweep or behind or self._clock() >= self._next_sweep or not self._change_journal
            found, journal_seen = self._journalled_changes(wall) if self._change_journal else ({}, 0)
            found.update(self._deletions(max(0, self._watermark - _CLOCK_SLACK_S), found))
            if sweeping:
                started, seen = self._clock(), 0
                for page in self._registry.scan(_REGISTRY.gt(s.UPDATED_AT, max(0, self._watermark - _CLOCK_SLACK_S))):
                    for record in page:
                        seen = max(seen, record.updated_at)
                        found[record.key] = view_of(record)
                self._advance_watermark(seen, int(wall))
                self._next_sweep = self._clock() + max(
                    self._sweep_interval, _RECONCILE_COST_FACTOR * (self._clock() - started)
                )
                self.sweeps += 1
            if self._reconcile_due:
                found.update(self._reconcile())
                self._reconcile_due = False
            self._journal_mark = max(self._journal_mark, min(journal_seen, int(wall)))
            self._journal_read_at = wall
            self.polls += 1
            for key, view in found.items():  # what the registry says now, against what queries see
                if self._visible.get(key) == view:
                    self._incoming.pop(key, None)
                    self._lagging_since.pop(key, None)
                else:
                    self._incoming[key] = view
            applied = self._apply()
            if not self._incoming:
                self.applied_through = max(self.applied_through, wall - _CLOCK_SLACK_S)
                self._start_incomplete = False
            return applied

    def _journalled_changes(self, wall: float) -> tuple[dict[str, DocumentView | None], int]:
        """The registry rows, read by key, of the documents journalled as changed since the journal
        mark (less the clock slack), and the newest journal time seen (the mark itself if none)."""
        seen = self._journal_mark
        keys: set[str] = set()
        for page in self._registry.changed_since(max(0, self._journal_mark - _CLOCK_SLACK_S)):
            for key, at in page:
                keys.add(key)
                seen = max(seen, at)
        found: dict[str, DocumentView | None] = {}
        ordered = sorted(keys)
        for start in range(0, len(ordered), _KEY_READ_BATCH):
            batch = ordered[start : start + _KEY_READ_BATCH]
            records = self._registry.get_many(batch)
            for key in batch:
                record = records.get(key)
                if record is not None:
                    found[key] = view_of(record)
                elif self.knows(key) or self._incoming.get(key) is not None:
                    found[key] = None  # changed, then deleted: the row is gone
        return found, seen

    def _apply(self) -> int:
        """Hands the incoming changes to the listeners; those every listener applied become visible."""
        if not self._incoming:
            return 0
        now = self._clock()
        changes = [
            DocumentChange(
                *_split(key),
                view,
                accept_short=now - self._lagging_since.get(key, now) >= self._give_up_after,
            )
            for key, view in self._incoming.items()
        ]
        failed: set[str] = set()
        for listener in self._listeners:
            failed.update(listener.documents_changed(changes) or ())
        for change in changes:
            key = change.key
            if key in failed:
                self._lagging_since.setdefault(key, now)
                continue
            if change.accept_short and key in self._lagging_since:
                logger.error(
                    "document %s: applied after %.0fs with the chunks the store returned, fewer than the registry "
                    "counts",
                    key,
                    now - self._lagging_since[key],
                )
            if change.now is None:
                self._visible.pop(key)
            else:
                self._visible[key] = change.now
            del self._incoming[key]
            self._lagging_since.pop(key, None)
        if failed:
            logger.warning(
                "%d registry change(s) not applied yet (e.g. %s): the previous versions stay visible; retrying",
                len(failed),
                ", ".join(sorted(failed)[:5]),
            )
        return len(changes) - len(failed)

    def _deletions(self, since: int, found: dict[str, DocumentView | None]) -> dict[str, None]:
        """Known documents whose delete was journalled since `since` and whose row is still gone
        (a key ingested again has a row again, which the registry changes already applied)."""
        candidates = [
            key for page in self._registry.deleted_since(since) for key in page if key not in found and self.knows(key)
        ]
        if not candidates:
            return {}
        back = self._registry.get_many(candidates)
        return {key: None for key in candidates if key not in back}

    def _reconcile(self) -> dict[str, None]:
        started = self._clock()
        keys: set[str] = set()
        for page in self._registry.scan_keys(_REGISTRY.gte(s.STATE, 0)):
            keys.update(page)
        known = set(self._visible) | {key for key, view in self._incoming.items() if view is not None}
        self._schedule_reconcile(self._clock() - started)
        return {key: None for key in known if key not in keys}

    def _schedule_reconcile(self, took_s: float) -> None:
        self._next_reconcile = self._clock() + max(self._reconcile_interval, _RECONCILE_COST_FACTOR * took_s)


class _ViewCodec:
    """A DocumentView packed: its generation, then chunk count, title, tags and metadata as compact
    JSON (tenant and document id are the table's key)."""

    def pack(self, view: DocumentView) -> tuple[str, bytes]:
        title, tags, metadata = view.fields
        rest = [view.chunk_count, title, list(tags), [list(pair) for pair in metadata], view.chunk_span]
        return view.generation, json.dumps(rest, ensure_ascii=False, separators=(",", ":")).encode()

    def unpack(self, key: str, generation: str, rest: bytes) -> DocumentView:
        chunk_count, title, tags, metadata, *span = json.loads(rest)  # no span: packed before it was
        tenant, document_id = _split(key)
        fields = (title, tuple(tags), tuple(tuple(pair) for pair in metadata))
        return DocumentView(tenant, document_id, generation, fields, int(chunk_count), int(span[0]) if span else 0)


VIEW_CODEC = _ViewCodec()


def _view_row(view: DocumentView) -> list[Any]:
    title, tags, metadata = view.fields
    return [
        view.tenant,
        view.document_id,
        view.generation,
        [title, list(tags), [list(p) for p in metadata]],
        view.chunk_count,
        view.chunk_span,
    ]


def _view_of_row(row: list[Any]) -> DocumentView:
    tenant, document_id, generation, (title, tags, metadata), chunk_count, *span = row
    fields = (title, tuple(tags), tuple(tuple(pair) for pair in metadata))
    return DocumentView(tenant, document_id, generation, fields, int(chunk_count), int(span[0]) if span else 0)


def _split(key: str) -> tuple[str, str]:
    tenant, _, document_id = key.rpartition("/")
    return tenant, document_id
