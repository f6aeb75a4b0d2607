"""Reading the next page of a scan while the caller works on the current one.

A scan of a large collection alternates between waiting for the store (milvus-lite spends its own
CPU on every row it returns) and the caller's work on the page (decoding rows, indexing them).
`prefetched` runs the page source in a thread, one page ahead, so the two overlap.
Pages keep their order; an error of the source is raised to the caller where the page it failed
to produce would have come; when the caller stops early (closes the generator), the source is
closed in its thread after the page it is fetching, and nothing more is read.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

_POLL_S = 0.1


class _End:
    pass


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Producer(Generic[T]):
    """Owns the source: reads it in its own thread into a queue of `depth` pages."""

    def __init__(self, source: Iterator[T], depth: int, name: str) -> None:
        self._source = source
        self.queue: queue.Queue[T | _End | _Failed] = queue.Queue(maxsize=depth)
        self.stopped = threading.Event()
        context = contextvars.copy_context()  # the caller's request id and trace follow the reads
        self.thread = threading.Thread(target=context.run, args=(self._run,), name=name, daemon=True)

    def _put(self, item: T | _End | _Failed) -> bool:
        while not self.stopped.is_set():
            try:
                self.queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for page in self._source:
                if not self._put(page):
                    return
            self._put(_End())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            self._put(_Failed(exc))
        finally:
            close = getattr(self._source, "close", None)
            if close is not None:
                close()


def prefetched(source: Iterator[T], *, depth: int = 1, name: str = "ragrpc-prefetch") -> Iterator[T]:
    """The items of `source`, read `depth` ahead in a thread."""
    if depth < 1:
        raise ValueError(f"prefetch depth must be at least 1, got {depth}")
    producer = _Producer(source, depth, name)
    producer.thread.start()
    try:
        while True:
            item = producer.queue.get()
            if isinstance(item, _End):
                return
            if isinstance(item, _Failed):
                raise item.exc
            yield item
    finally:
        producer.stopped.set()
