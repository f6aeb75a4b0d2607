"""Load shedding for ingestion: at most `limit` documents queued or in progress at once;
beyond that callers get RESOURCE_EXHAUSTED instead of the process growing until killed.

`reserve` hands out a `Reservation`; whoever holds it releases it on every path (the upload's
receiving code until it hands the document to an ingestion, then the ingestion's task when it
ends, however it ends). A reservation releases at most what it reserved, so a path that
releases twice cannot eat another caller's slots.
"""

from __future__ import annotations

import threading

from ragrpc import errors


class Reservation:
    """`count` admitted documents, released one by one or all at once."""

    def __init__(self, gate: AdmissionGate, count: int) -> None:
        self._gate = gate
        self._left = count

    @property
    def held(self) -> int:
        return self._left

    def release(self, count: int = 1) -> None:
        released = min(count, self._left)
        self._left -= released
        self._gate._give_back(released)

    def release_all(self) -> None:
        self.release(self._left)


class AdmissionGate:
    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._pending = 0
        self._lock = threading.Lock()

    @property
    def pending(self) -> int:
        return self._pending

    def reserve(self, count: int) -> Reservation:
        with self._lock:
            if self._pending + count > self._limit:
                raise errors.LimitExceededError(
                    f"the ingest service is busy: {self._pending} documents in progress, limit {self._limit} "
                    "(RAGRPC_MAX_PENDING_DOCUMENTS); retry later",
                    reason="INGEST_QUEUE_FULL",
                    metadata={"pending": str(self._pending), "limit": str(self._limit)},
                )
            self._pending += count
        return Reservation(self, count)

    def _give_back(self, count: int) -> None:
        if count <= 0:
            return
        with self._lock:
            self._pending = max(0, self._pending - count)
