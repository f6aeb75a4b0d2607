"""An ingestion attempt's handle and the helpers of the lifecycle that hold no state: the etag of a
document (AIP-154), store writes tracked until they finished, and work that runs to its end
despite a cancellation (a rollback must not stop half-way). See ingest_service.lifecycle."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import hashlib
import json
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ragrpc.models import DocumentRecord

T = TypeVar("T")


def document_etag(record: DocumentRecord) -> str:
    """AIP-154 etag of a document: changes whenever anything a caller can see of it changes."""
    visible = {
        name: value
        for name, value in dataclasses.asdict(record).items()
        if name not in ("pending_generation", "stale_generation", "deleting")
    }
    digest = hashlib.sha256(json.dumps(visible, sort_keys=True, default=str).encode()).hexdigest()
    return f'"{digest[:24]}"'


@dataclass
class Attempt:
    """One ingestion attempt of a document, between `begin` and `commit` / `fail`."""

    record: DocumentRecord  # what the attempt will commit; pending_generation = generation
    existing: DocumentRecord | None  # the stored record when it began (the version it replaces)
    generation: str
    _executor: Executor
    _in_flight: set[concurrent.futures.Future[Any]] = field(default_factory=set)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """A store write of the attempt, in a store thread, tracked until it has finished."""
        future = self._executor.submit(fn, *args)
        self._in_flight.add(future)
        future.add_done_callback(self._in_flight.discard)
        return await asyncio.wrap_future(future)

    async def quiesce(self) -> None:
        """Waits for every write of the attempt still running in a store thread."""
        running = [asyncio.wrap_future(f) for f in list(self._in_flight)]
        if running:
            await asyncio.wait(running)


async def finish_despite_cancel(work: Awaitable[T]) -> T:
    """Runs `work` to its end even when the caller is cancelled meanwhile (a rollback must not stop
    half-way); a cancellation that arrived is raised afterwards."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
            continue
        if cancelled:
            raise asyncio.CancelledError
        return result
