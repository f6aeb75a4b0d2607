"""Ingestions belong to the service, not to the call that asked for one.

Each document is ingested in a task of its own, started by `submit`. The caller (an upload
RPC, a job) waits for it through `asyncio.shield`, so a caller that cancels, disconnects or
runs past its deadline only stops waiting: the ingestion finishes (or fails and rolls back)
by itself, bounded by the document timeout, and GetDocument shows how it ended. The task
releases the document's admission reservation and drops its spooled bytes when it ends,
however it ends (a done callback: it runs even for a task cancelled before it started).

`concurrency` documents are in flight at once across all callers (uploads and jobs share the
slots), first come, first served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from ingest_service.admission import Reservation
from ingest_service.pipeline import IngestOutcome, IngestPipeline, ProgressCallback
from ingest_service.requests import IngestItem

logger = logging.getLogger(__name__)


class Ingestions:
    def __init__(self, pipeline: IngestPipeline, concurrency: int = 2) -> None:
        self._pipeline = pipeline
        self._concurrency = max(1, concurrency)
        self._slots: asyncio.Semaphore | None = None
        self._slots_loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[IngestOutcome]] = set()

    @property
    def running(self) -> int:
        """Ingestions started and not ended (waiting for a slot or in progress)."""
        return len(self._tasks)

    def submit(
        self, item: IngestItem, reservation: Reservation, progress: ProgressCallback | None = None
    ) -> asyncio.Task[IngestOutcome]:
        """Starts the ingestion of `item`; the task owns one document of `reservation` from now on."""
        task = asyncio.get_running_loop().create_task(self._pipeline.ingest(item, progress, slot=self._slot()))
        self._tasks.add(task)

        def ended(done: asyncio.Task[IngestOutcome]) -> None:
            self._tasks.discard(done)
            reservation.release(1)
            item.close()
            if not done.cancelled():
                done.exception()  # retrieved: the caller may have stopped waiting

        task.add_done_callback(ended)
        return task

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots_loop is not loop:
            self._slots, self._slots_loop = asyncio.Semaphore(self._concurrency), loop
        async with self._slots:
            yield

    async def drain(self, timeout_s: float) -> None:
        """At shutdown: waits up to timeout_s for the ingestions in flight, then cancels the rest
        (they roll back; recovery at the next start finishes what a rollback could not)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)
        left = list(self._tasks)
        if left:
            logger.warning("shutting down: %d ingestion(s) did not finish in time and are rolled back", len(left))
            for task in left:
                task.cancel()
            await asyncio.wait(left, timeout=max(1.0, timeout_s))
