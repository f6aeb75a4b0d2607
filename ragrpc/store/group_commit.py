"""Group commit for row writes: writes that queue behind the one writer leave in one call.

The writer runs one mutating call at a time (see `MilvusConnection`). Ingestion makes many
small writes (a registry upsert of one row, an insert of a document's few chunks), and each
call costs milvus-lite and the client a fixed few milliseconds besides its rows. So while a
write runs, the writes of the same kind to the same collection that arrive behind it wait in
a queue, and the next call sends all of them: `write` relays the calls (see `relay`), one
of the waiting callers makes them, the oldest queued write's group first.

Each caller still returns only after its own rows are written, so the order of one document's
writes (registry marker, chunks, registry switch) is unchanged, and a crash between calls
leaves what it left before. Rows with a primary key already queued in the group start a new
group (one call never upserts the same key twice). If a merged call fails for a reason other
than the store being unreachable, each caller's rows are written again on their own, so one
bad row fails only its own caller.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from ragrpc.store.relay import Queued, Relay

Row = dict[str, Any]
GroupKey = tuple[str, str]  # (operation, collection)


@dataclass(eq=False)
class PendingWrite(Queued):
    rows: list[Row]
    keys: frozenset[Any]
    write: Callable[[list[Row]], object] | None = None  # the call that writes rows of its group


class WriteGroups:
    """The queues of pending row writes, one per (operation, collection).

    `write` queues a caller's rows and returns once they are written. Underneath, `enqueue` adds
    them, and the caller serving the queues (holding the writer lock) calls `take` for the group
    to send next and `send` to make the call."""

    def __init__(self, max_rows: int = 512) -> None:
        if max_rows < 1:
            raise ValueError("max_rows must be at least 1")
        self._max_rows = max_rows
        self._queues: dict[GroupKey, deque[PendingWrite]] = {}
        self._relay = Relay()
        self._lock = self._relay.lock  # the queues and the serving role, together
        self.calls = 0  # store calls made
        self.writes = 0  # callers' writes they carried

    def enqueue(
        self,
        group: GroupKey,
        rows: list[Row],
        key_field: str,
        write: Callable[[list[Row]], object] | None = None,
    ) -> PendingWrite:
        pending = PendingWrite(rows=rows, keys=frozenset(row[key_field] for row in rows), write=write)
        with self._lock:
            self._relay.arrived(pending)
            self._queues.setdefault(group, deque()).append(pending)
        return pending

    def write(
        self,
        group: GroupKey,
        rows: list[Row],
        key_field: str,
        write: Callable[[list[Row]], object],
        retry_alone: Callable[[BaseException], bool],
        writer_lock: AbstractContextManager[Any],
        linger: Callable[[], None] | None = None,
    ) -> None:
        """Writes the rows with `write(rows)` (the group's call; it gets the rows of every write
        queued with them), one call at a time under `writer_lock`; raises this caller's error.
        `linger`, when given, runs once the rows are queued, before they compete for a call."""
        pending = self.enqueue(group, rows, key_field, write)
        if linger is not None:
            linger()
        self._relay.serve(pending, lambda: self._serve_next(retry_alone, writer_lock), self._oldest)
        if pending.error is not None:
            raise pending.error

    def waiting(self, group: GroupKey) -> int:
        """Writes of the group queued and not yet taken by a call."""
        with self._lock:
            return len(self._queues.get(group, ()))

    def _oldest_group(self) -> GroupKey | None:
        """The group of the write queued first (call under the lock)."""
        heads = [(queue[0].seq, group) for group, queue in self._queues.items()]
        return min(heads)[1] if heads else None

    def _oldest(self) -> PendingWrite | None:
        group = self._oldest_group()
        return self._queues[group][0] if group is not None else None

    def _serve_next(
        self, retry_alone: Callable[[BaseException], bool], writer_lock: AbstractContextManager[Any]
    ) -> None:
        with self._lock:
            group = self._oldest_group()
        if group is None:
            raise RuntimeError("group commit: a write is neither queued nor written")
        with writer_lock:
            batch = self.take(group)
            if not batch:
                return
            write = batch[0].write
            assert write is not None, "a relayed write names its call"
            Relay.carry(batch, lambda: self.send(batch, write, retry_alone))

    def take(self, group: GroupKey) -> list[PendingWrite]:
        """The writes at the head of the group's queue that go in one call: at least one, then
        more while the rows stay within max_rows and no primary key repeats."""
        with self._lock:
            queue = self._queues.get(group)
            if queue is None:
                return []
            taken: list[PendingWrite] = []
            rows = 0
            keys: set[Any] = set()
            while queue:
                head = queue[0]
                if taken and (rows + len(head.rows) > self._max_rows or not keys.isdisjoint(head.keys)):
                    break
                taken.append(queue.popleft())
                rows += len(head.rows)
                keys |= head.keys
            if not queue:
                del self._queues[group]
            return taken

    def send(
        self,
        batch: list[PendingWrite],
        write: Callable[[list[Row]], object],
        retry_alone: Callable[[BaseException], bool],
    ) -> None:
        """Writes the batch's rows in one call and records each caller's outcome. After a failure
        that `retry_alone` accepts, each caller's rows are written again by themselves."""
        self.calls += 1
        self.writes += len(batch)
        try:
            write([row for pending in batch for row in pending.rows])
        except Exception as exc:  # noqa: BLE001 - handed to each caller
            if len(batch) == 1 or not retry_alone(exc):
                for pending in batch:
                    pending.error = exc
                    pending.done = True
                return
            for pending in batch:
                self.calls += 1
                try:
                    write(pending.rows)
                except Exception as alone:  # noqa: BLE001
                    pending.error = alone
                pending.done = True
            return
        for pending in batch:
            pending.done = True
