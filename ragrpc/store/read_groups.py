"""Grouped reads by primary key: reads of one collection and of the same fields that queue
behind a running read leave in one call.

Ingestion reads the registry row of every document before it starts (one `get` by primary
key). Documents start in bursts (the documents of one model call finish together and free
their slots at once), and each call costs milvus-lite and the client a fixed few
milliseconds besides its rows. So one read per collection runs at a time, the reads that
arrive meanwhile wait, and the next call fetches every waiting key at once (made by one of the
waiting callers, see `relay`).

A read still returns only rows written before it was asked for (its keys are fetched by a
call that starts after it queued). Only reads that ask for the same fields (`fields`) share a
call: the call is made with one caller's `fetch`, so a read merged into another's would get that
caller's fields (a read of the BM25 terms or the vectors queued behind a read of the plain rows
got rows without them, 2026-12-08). If a merged call fails for a reason other than the store
being unreachable, each caller's keys are fetched again on their own, so one bad key fails
only its own caller.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from ragrpc.store.relay import Queued, Relay

Row = dict[str, Any]


@dataclass(eq=False)
class PendingRead(Queued):
    keys: list[Hashable]
    rows: list[Row] = field(default_factory=list)


class _CollectionReads:
    """The waiting reads of one collection and the relay that serves them (see `relay`)."""

    def __init__(self) -> None:
        self.relay = Relay()
        self.waiting: deque[PendingRead] = deque()

    def oldest(self) -> PendingRead | None:
        return self.waiting[0] if self.waiting else None


class ReadGroups:
    """Queues of waiting reads, one per collection and fields, each served by one call at a time."""

    def __init__(self, max_keys: int = 512) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        self._max_keys = max_keys
        self._queues: dict[tuple[str, Hashable], _CollectionReads] = {}
        self._lock = threading.Lock()
        self.calls = 0  # store calls made
        self.reads = 0  # callers' reads they carried

    def _of(self, collection: str, fields: Hashable) -> _CollectionReads:
        with self._lock:
            reads = self._queues.get((collection, fields))
            if reads is None:
                reads = self._queues[(collection, fields)] = _CollectionReads()
            return reads

    def get(
        self,
        collection: str,
        keys: list[Hashable],
        fetch: Callable[[list[Hashable]], list[Row]],
        key_of: Callable[[Row], Hashable],
        retry_alone: Callable[[BaseException], bool],
        linger: Callable[[], None] | None = None,
        fields: Hashable = (),
    ) -> list[Row]:
        """The rows of `keys` (those that exist), fetched with `fetch(keys)`, possibly in one call
        with the keys of other callers of the same collection and `fields` (what `fetch` reads of a
        row) that waited at the same time. `linger`, when given, runs once the read is queued,
        before it competes for the call (reads arriving meanwhile join it)."""
        if not keys:
            return []
        pending = PendingRead(keys=list(keys))
        reads = self._of(collection, fields)
        with reads.relay.lock:
            reads.relay.arrived(pending)
            reads.waiting.append(pending)
        if linger is not None:
            linger()
        reads.relay.serve(pending, lambda: self._serve_next(reads, fetch, key_of, retry_alone), reads.oldest)
        if pending.error is not None:
            raise pending.error
        return pending.rows

    def waiting(self, collection: str, fields: Hashable = ()) -> int:
        """Reads of the collection and fields queued and not yet taken by a call."""
        reads = self._of(collection, fields)
        with reads.relay.lock:
            return len(reads.waiting)

    def _serve_next(
        self,
        reads: _CollectionReads,
        fetch: Callable[[list[Hashable]], list[Row]],
        key_of: Callable[[Row], Hashable],
        retry_alone: Callable[[BaseException], bool],
    ) -> None:
        batch = self._take(reads)
        Relay.carry(batch, lambda: self._send(batch, fetch, key_of, retry_alone))

    def _take(self, reads: _CollectionReads) -> list[PendingRead]:
        """The waiting reads at the head of the queue: at least one, then more while the keys
        stay within max_keys."""
        with reads.relay.lock:
            queue = reads.waiting
            taken = [queue.popleft()]
            keys = len(taken[0].keys)
            while queue and keys + len(queue[0].keys) <= self._max_keys:
                keys += len(queue[0].keys)
                taken.append(queue.popleft())
            return taken

    def _send(
        self,
        batch: list[PendingRead],
        fetch: Callable[[list[Hashable]], list[Row]],
        key_of: Callable[[Row], Hashable],
        retry_alone: Callable[[BaseException], bool],
    ) -> None:
        self.calls += 1
        self.reads += len(batch)
        try:
            rows = fetch(list(dict.fromkeys(k for pending in batch for k in pending.keys)))
        except Exception as exc:  # noqa: BLE001 - handed to each caller
            if len(batch) == 1 or not retry_alone(exc):
                for pending in batch:
                    pending.error, pending.done = exc, True
                return
            for pending in batch:
                self.calls += 1
                try:
                    pending.rows = fetch(pending.keys)
                except Exception as alone:  # noqa: BLE001
                    pending.error = alone
                pending.done = True
            return
        by_key = {key_of(row): row for row in rows}
        for pending in batch:
            pending.rows = [by_key[k] for k in dict.fromkeys(pending.keys) if k in by_key]
            pending.done = True
