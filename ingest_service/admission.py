"""Load shedding for ingestion: at most `limit` documents queued or in progress at once;
beyond that callers get RESOURCE_EXHAUSTED instead of the process growing until killed."""

from __future__ import annotations

import threading

from ragrpc import errors


class AdmissionGate:
    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._pending = 0
        self._lock = threading.Lock()

    @property
    def pending(self) -> int:
        return self._pending

    def reserve(self, count: int) -> None:
        with self._lock:
            if self._pending + count > self._limit:
                raise errors.LimitExceededError(
                    f"the ingest service is busy: {self._pending} documents in progress, limit {self._limit} "
                    "(RAGRPC_MAX_PENDING_DOCUMENTS); retry later",
                    reason="INGEST_QUEUE_FULL",
                    metadata={"pending": str(self._pending), "limit": str(self._limit)},
                )
            self._pending += count

    def release(self, count: int = 1) -> None:
        with self._lock:
            self._pending = max(0, self._pending - count)
