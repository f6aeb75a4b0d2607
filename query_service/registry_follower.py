"""The query service's view of the document registry, followed in the background.

The ingest service (another process) writes the registry; this class keeps, in memory, which
generation of every document is visible (ACTIVE, not being deleted) and a fingerprint of the
document-level fields copied onto its chunks (title, tags, metadata). It answers the
retrieval pipeline's visibility check without a store call, and tells its listeners (the
in-process BM25 index) what changed, in batches.

    load()  -> one paged scan of the registry's ACTIVE rows (before the service reports SERVING)
    poll()  -> rows whose updated_at passed the watermark (one paged query) and the deletion
               journal since then (one query; a delete removes the registry row, so the journal is
               how a follower learns of it), applied as one batch; every `reconcile_interval_s`
               (and at least 20x the last listing's time) also a paged listing of all keys, a
               backstop for journal entries purged while this process was away

Nothing here runs on the request path: RegistryFollowTask (query_service/background.py) calls
poll() every RAGRPC_REGISTRY_FOLLOW_INTERVAL_S off the event loop. A document is therefore
searchable, and a deleted one gone, within about one interval plus the poll's own time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from ragrpc.models import DocumentRecord, DocumentState, document_key
from ragrpc.store import schema as s
from ragrpc.store.base import DocumentRegistry
from ragrpc.store.filters import FilterBuilder

logger = logging.getLogger(__name__)

_REGISTRY = FilterBuilder(s.REGISTRY_FILTERABLE_FIELDS)
_CLOCK_SLACK_S = 2  # updated_at has 1 s resolution and the clocks of two processes differ
_RECONCILE_COST_FACTOR = 20  # reconcile at most 1/20 of the time


@dataclass(frozen=True)
class DocumentView:
    """What the query service needs of a visible document."""

    tenant: str
    document_id: str
    generation: str
    fields: tuple  # title, tags, metadata as copied onto the chunks

    @property
    def key(self) -> str:
        return document_key(self.tenant, self.document_id)


@dataclass(frozen=True)
class DocumentChange:
    """A document whose visible generation or chunk fields changed; `now` None: no longer visible."""

    tenant: str
    document_id: str
    now: DocumentView | None


class RegistryListener(Protocol):
    def documents_loaded(self, documents: list[DocumentView]) -> None:
        """One page of the start-up load."""
        ...

    def load_finished(self) -> None:
        """The start-up load is complete (the listener may now read what it needs of the documents)."""
        ...

    def documents_changed(self, changes: list[DocumentChange]) -> None: ...


def chunk_fields(record: DocumentRecord) -> tuple:
    """The document-level fields copied onto every chunk (filters on them run inside the index)."""
    return (record.title, tuple(record.tags), tuple(sorted((str(k), str(v)) for k, v in record.metadata.items())))


def view_of(record: DocumentRecord) -> DocumentView | None:
    if record.state != DocumentState.ACTIVE or not record.generation or record.deleting:
        return None
    return DocumentView(record.tenant, record.document_id, record.generation, chunk_fields(record))


class RegistryFollower:
    def __init__(
        self,
        registry: DocumentRegistry,
        *,
        reconcile_interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._registry = registry
        self._reconcile_interval = reconcile_interval_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._visible: dict[str, DocumentView] = {}
        self._listeners: list[RegistryListener] = []
        self._watermark = 0  # registry updated_at seen so far
        self._next_reconcile = float("inf")
        self._lock = threading.Lock()  # one load/poll at a time; readers need no lock (dict reads)
        self.loaded = False
        self.polls = 0

    def add_listener(self, listener: RegistryListener) -> None:
        self._listeners.append(listener)

    @property
    def listeners(self) -> tuple[RegistryListener, ...]:
        return tuple(self._listeners)

    def generations(self, keys: Iterable[str]) -> dict[str, str]:
        """The visible generation of each of these document keys that is visible."""
        visible = self._visible
        return {key: view.generation for key in keys if (view := visible.get(key)) is not None}

    @property
    def ready(self) -> bool:
        return self.loaded

    @property
    def document_count(self) -> int:
        return len(self._visible)

    def load(self) -> int:
        """Every visible document, page by page; listeners get each page as it arrives."""
        with self._lock:
            started, wall = self._clock(), int(self._wall_clock())
            pages = seen = 0
            for page in self._registry.scan(_REGISTRY.eq(s.STATE, int(DocumentState.ACTIVE))):
                views = [view for record in page if (view := view_of(record)) is not None]
                self._visible.update((view.key, view) for view in views)
                seen = max([seen, *(record.updated_at for record in page)])
                for listener in self._listeners:
                    listener.documents_loaded(views)
                pages += 1
                if pages % 10 == 0:
                    logger.info("registry: %d documents loaded", len(self._visible))
            self._advance_watermark(seen, wall)
            for listener in self._listeners:
                listener.load_finished()
            self.loaded = True
            self._schedule_reconcile(self._clock() - started)
            return len(self._visible)

    def _advance_watermark(self, seen: int, wall_at_start: int) -> None:
        """A page scan runs in key order, so a row changed behind it during the scan is not in it: the
        next poll starts from when this one started (or the newest row seen, if older), not later."""
        self._watermark = max(self._watermark, min(seen, wall_at_start))

    def poll(self, *, reconcile: bool = False) -> int:
        """Applies registry changes since the last poll; returns how many documents changed."""
        with self._lock:
            changes: list[DocumentChange] = []
            wall, seen = int(self._wall_clock()), 0
            since = max(0, self._watermark - _CLOCK_SLACK_S)
            for page in self._registry.scan(_REGISTRY.gt(s.UPDATED_AT, since)):
                for record in page:
                    seen = max(seen, record.updated_at)
                    change = self._change(record.tenant, record.document_id, view_of(record))
                    if change is not None:
                        changes.append(change)
            changes += self._deletions(since)
            self._advance_watermark(seen, wall)
            if reconcile or self._clock() >= self._next_reconcile:
                changes += self._reconcile()
            self.polls += 1
            if changes:
                for listener in self._listeners:
                    listener.documents_changed(changes)
            return len(changes)

    def _change(self, tenant: str, document_id: str, now: DocumentView | None) -> DocumentChange | None:
        key = document_key(tenant, document_id)
        before = self._visible.get(key)
        if before == now:
            return None
        if now is None:
            self._visible.pop(key, None)
        else:
            self._visible[key] = now
        return DocumentChange(tenant, document_id, now)

    def _deletions(self, since: int) -> list[DocumentChange]:
        """Visible documents whose delete was journalled since `since` and whose row is still gone
        (a key ingested again has a row again, which the registry changes already applied)."""
        candidates = [key for page in self._registry.deleted_since(since) for key in page if key in self._visible]
        if not candidates:
            return []
        back = self._registry.get_many(candidates)
        changes = []
        for key in candidates:
            if key not in back:
                view = self._visible[key]
                change = self._change(view.tenant, view.document_id, None)
                if change is not None:
                    changes.append(change)
        return changes

    def _reconcile(self) -> list[DocumentChange]:
        started = self._clock()
        keys: set[str] = set()
        for page in self._registry.scan_keys(_REGISTRY.gte(s.STATE, 0)):
            keys.update(page)
        gone = [view for key, view in list(self._visible.items()) if key not in keys]
        changes = [c for view in gone if (c := self._change(view.tenant, view.document_id, None)) is not None]
        self._schedule_reconcile(self._clock() - started)
        return changes

    def _schedule_reconcile(self, took_s: float) -> None:
        self._next_reconcile = self._clock() + max(self._reconcile_interval, _RECONCILE_COST_FACTOR * took_s)
