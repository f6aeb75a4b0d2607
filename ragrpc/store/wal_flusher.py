"""Flushes what the writer wrote, so searches run over sealed, indexed data.

A milvus-lite (3.x) server keeps every written row in its write-ahead log until a client calls
flush(); it never seals on its own. Searches over rows still in the WAL, written in the small
per-document batches ingestion produces, are many times slower than over the same rows after
a flush (`make bench`, section wal; docs/benchmarks.md). Milvus proper seals segments
itself and discourages frequent client flushes, so `auto` flushes only on milvus-lite.

The writer (the ingest service) runs one `WalFlusher`: once writes have paused for `idle_s`, or
at least every `max_interval_s` while they continue, it flushes the collections. A flush takes
the writer lock, so it never runs between the halves of a write, and a failed flush (the store
is away) is simply tried again on a later tick.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ragrpc import errors
from ragrpc.store.collections import is_milvus_lite
from ragrpc.supervised import SupervisedLoop

logger = logging.getLogger(__name__)

FLUSH_MODES = ("auto", "on", "off")


class FlushableConnection(Protocol):
    unflushed_since: float | None
    last_write_at: float

    def flush(self, names: Sequence[str]) -> None: ...


def flush_enabled(mode: str, server_version: str) -> bool:
    """Whether the writer should flush: `auto` means only on a milvus-lite server."""
    if mode not in FLUSH_MODES:
        raise ValueError(f"RAGRPC_MILVUS_FLUSH={mode!r} is not one of {', '.join(FLUSH_MODES)}")
    if mode == "auto":
        return is_milvus_lite(server_version)
    return mode == "on"


class WalFlusher:
    def __init__(
        self,
        connection: FlushableConnection,
        names: Sequence[str],
        *,
        idle_s: float = 2.0,
        max_interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._conn = connection
        self._names = list(names)
        self._idle_s = idle_s
        self._max_interval_s = max_interval_s
        self._clock = clock
        self.flushes = 0

    def due(self) -> bool:
        since = self._conn.unflushed_since
        if since is None:
            return False
        now = self._clock()
        return now - self._conn.last_write_at >= self._idle_s or now - since >= self._max_interval_s

    def flush_if_due(self, force: bool = False) -> bool:
        """Flushes when due (or, with force, whenever something is unflushed, e.g. at shutdown);
        True when it did. Store errors are logged and left for the next try."""
        if not (self.due() or (force and self._conn.unflushed_since is not None)):
            return False
        started = self._clock()
        try:
            self._conn.flush(self._names)
        except errors.RagrpcError as exc:
            logger.info("flush of %s postponed: %s", ", ".join(self._names), exc.message)
            return False
        self.flushes += 1
        logger.debug("flushed %s in %.2fs", ", ".join(self._names), self._clock() - started)
        return True

    async def run(self, tick_s: float = 0.5) -> None:
        """Until cancelled: checks every tick_s, flushing off the event loop (unsupervised: an
        unexpected error ends it; the service runs it as `supervised_flusher`)."""
        while True:
            await asyncio.sleep(tick_s)
            if self.due():
                await asyncio.to_thread(self.flush_if_due)


def supervised_flusher(flusher: WalFlusher, metrics: Any = None, tick_s: float = 0.5) -> SupervisedLoop:
    """The flusher as a supervised loop: an unexpected error (not just a store error) is logged,
    counted (`ragrpc_background_failures_total{task="wal-flush"}`) and the flusher tried again
    with backoff, so searches never stay on the write-ahead log because the flusher died."""
    return SupervisedLoop(
        "wal-flush",
        flusher.flush_if_due,
        interval_s=tick_s,
        on_failure=(lambda task: metrics.background_failures.labels(task).inc()) if metrics is not None else None,
    )
