"""A budget of bytes held at once by the memory-heavy part of ingestion (a document's bytes read
back, its extracted text and blocks, its chunk drafts): a document waits until its size fits
next to the others; one larger than the whole budget runs alone. First come, first served, so
a large document is not starved by a stream of small ones."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator


class ByteBudget:
    def __init__(self, limit_bytes: int) -> None:
        self._limit = max(1, limit_bytes)
        self._used = 0
        self._holders = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def used(self) -> int:
        return self._used

    def _fits(self, size: int) -> bool:
        return self._holders == 0 or self._used + size <= self._limit

    @contextlib.asynccontextmanager
    async def hold(self, size: int) -> AsyncIterator[None]:
        size = max(0, size)
        if self._waiters or not self._fits(size):
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (size, waiter)
            self._waiters.append(entry)
            try:
                await waiter
            except BaseException:
                if entry in self._waiters:
                    self._waiters.remove(entry)
                elif waiter.done() and not waiter.cancelled():
                    self._release(size)  # granted just as it was cancelled
                self._wake()
                raise
        else:
            self._take(size)
        try:
            yield
        finally:
            self._release(size)

    def _take(self, size: int) -> None:
        self._used += size
        self._holders += 1

    def _release(self, size: int) -> None:
        self._used -= size
        self._holders -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._fits(self._waiters[0][0]):
            size, waiter = self._waiters.popleft()
            if waiter.done():
                continue
            self._take(size)
            waiter.set_result(None)
