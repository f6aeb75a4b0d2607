"""The writer's change journal: after each registry write, the document's key goes into a small
journal (ragrpc.store.schema.CHANGE_JOURNAL_TENANT rows of the jobs collection), so that query
services following the registry learn what changed by reading the few rows written lately instead
of filtering the whole registry on `updated_at` (which milvus-lite answers by scanning it: 1.2-1.4 s
at 1M documents, most of a 3.9 s ingest-to-searchable there).

A put of a document that has never had a visible version (no generation yet: a first attempt
starting, or failing) changes no follower's view and is not journalled: one journal write per new
document, not one per registry write.

The journal is a hint. Its write comes after the registry write, so a reader that finds a key there
reads the row it names, and a journal write that fails (before or after it was applied, or never
answered) fails the put as the registry write's failure would: the caller sees an error and the
document's lifecycle handles it as any failed put, and readers find the change at their next sweep
of the registry (RAGRPC_REGISTRY_SWEEP_INTERVAL_S) if no later journal entry names the document.

Entries older than schema.CHANGE_JOURNAL_KEEP_S are purged, at most every
schema.CHANGE_JOURNAL_PURGE_S, by the writer after a journal write; a failed purge is logged and
tried again at the next one (a journal that keeps old entries longer only costs its readers rows).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ragrpc import errors
from ragrpc.models import DocumentRecord
from ragrpc.store import schema as s
from ragrpc.store.base import DocumentRegistry

logger = logging.getLogger(__name__)


class JournalledRegistry:
    """A DocumentRegistry whose puts also journal the document's key; everything else passes through."""

    def __init__(
        self,
        inner: DocumentRegistry,
        *,
        keep_s: int = s.CHANGE_JOURNAL_KEEP_S,
        purge_every_s: float = s.CHANGE_JOURNAL_PURGE_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._inner = inner
        self._keep_s = keep_s
        self._purge_every_s = purge_every_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._purge_lock = threading.Lock()
        self._next_purge = float("-inf")  # the first journal write purges what earlier runs left

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def put(self, record: DocumentRecord) -> None:
        self._inner.put(record)
        if record.generation:  # "": no attempt ever succeeded (generation is never reset), never visible
            self._inner.journal_changes([record.key])
            self._purge_when_due()

    def _purge_when_due(self) -> None:
        with self._purge_lock:  # one purge at a time; the other writers go on
            if self._clock() < self._next_purge:
                return
            self._next_purge = self._clock() + self._purge_every_s
        try:
            self._inner.purge_changes(int(self._wall_clock()) - self._keep_s)
        except errors.RagrpcError as exc:
            logger.warning(
                "change journal: purging entries older than %ds failed (tried again later): %s", self._keep_s, exc
            )
