"""Group commit for row writes: writes that queue behind the one writer leave in one call.

The writer runs one mutating call at a time (see `MilvusConnection`). Ingestion makes many
small writes (a registry upsert of one row, an insert of a document's few chunks), and each
call costs milvus-lite and the client a fixed few milliseconds besides its rows. So while a
write runs, the writes of the same kind to the same collection that arrive behind it wait in
a queue, and the next writer to take the lock sends all of them in one call.

Each caller still returns only after its own rows are written, so the order of one document's
writes (registry marker, chunks, registry switch) is unchanged, and a crash between calls
leaves what it left before. Rows with a primary key already queued in the group start a new
group (one call never upserts the same key twice). If a merged call fails for a reason other
than the store being unreachable, each caller's rows are written again on their own, so one
bad row fails only its own caller.
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Row = dict[str, Any]
GroupKey = tuple[str, str]  # (operation, collection)


@dataclass
class PendingWrite:
    rows: list[Row]
    keys: frozenset[Any]
    done: bool = False
    error: BaseException | None = None


class WriteGroups:
    """The queues of pending row writes, one per (operation, collection).

    `enqueue` adds a caller's rows; the writer (holding the writer lock) calls `take` for the
    group to send next and `settle` once the call returned."""

    def __init__(self, max_rows: int = 512) -> None:
        if max_rows < 1:
            raise ValueError("max_rows must be at least 1")
        self._max_rows = max_rows
        self._queues: dict[GroupKey, deque[PendingWrite]] = defaultdict(deque)
        self._lock = threading.Lock()
        self.calls = 0  # store calls made
        self.writes = 0  # callers' writes they carried

    def enqueue(self, group: GroupKey, rows: list[Row], key_field: str) -> PendingWrite:
        pending = PendingWrite(rows=rows, keys=frozenset(row[key_field] for row in rows))
        with self._lock:
            self._queues[group].append(pending)
        return pending

    def take(self, group: GroupKey) -> list[PendingWrite]:
        """The writes at the head of the group's queue that go in one call: at least one, then
        more while the rows stay within max_rows and no primary key repeats."""
        with self._lock:
            queue = self._queues[group]
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
