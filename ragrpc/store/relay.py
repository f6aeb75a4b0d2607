"""The relay of grouped calls: one thread at a time makes the calls that serve a queue, and hands
that role on; every other caller sleeps until its own item is done.

Group commit (`group_commit`) and grouped reads (`read_groups`) queue the callers' rows or keys
and send what queued in one call, one call at a time. They used to do it with one lock that each
caller took in turn, also a caller whose rows another caller's call had already carried. Under
load tens of store threads queued on that lock, and each hand-over of it waited for the GIL (up
to the interpreter's switch interval), so a write into milvus-lite waited about 50 ms for a lock
that was busy half the time (the ingest service at its ceiling, docs/benchmarks.md).

With the relay, the caller that finds no one serving becomes the server: it makes calls, oldest
queued item first, until its own item is done, then hands the role to the owner of the oldest
item still queued (or drops it when the queue is empty). Every other caller sleeps on its own
item's event and is woken once: when its item is done, or when the role is handed to it.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(eq=False, kw_only=True)
class Queued:
    """An item of a relayed queue: its outcome (done, error) and its place in the relay."""

    done: bool = False
    error: BaseException | None = None
    seq: int = 0  # the relay's order of arrival
    serving: bool = False  # the role was handed to this item's owner
    woken: threading.Event = field(default_factory=threading.Event, repr=False)


class Relay:
    """The serving role over one queue (or several queues served one call at a time).

    `lock` guards the queue(s) as well as the role: an item is queued and the role is dropped
    under the same lock, so no item is left queued without a server."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._serving = False
        self._arrivals = itertools.count()

    def arrived(self, item: Queued) -> None:
        """Numbers an item being queued (call under `lock`)."""
        item.seq = next(self._arrivals)

    def wait_turn(self, item: Queued) -> bool:
        """Blocks until the item is done (False) or its owner holds the serving role (True)."""
        with self.lock:
            if item.done:
                return False
            if not self._serving:
                self._serving = item.serving = True
                return True
        while True:
            item.woken.wait()
            item.woken.clear()
            if item.done:
                return False
            if item.serving:
                return True

    def hand_over(self, oldest: Callable[[], Queued | None]) -> None:
        """Gives the serving role to the owner of the oldest queued item (`oldest()`, called under
        `lock`), or drops it when nothing is queued."""
        with self.lock:
            following = oldest()
            if following is None:
                self._serving = False
            else:
                following.serving = True
        if following is not None:
            following.woken.set()

    @staticmethod
    def carry(items: Sequence[Queued], call: Callable[[], None]) -> None:
        """Runs `call()`, the call that settles these items (taken off the queue), and wakes their
        owners. An exception that is not an Exception (the interpreter is stopping) escapes it
        still answers each of them."""
        try:
            call()
        except BaseException as exc:
            for item in items:
                if not item.done:
                    item.error, item.done = exc, True
            raise
        finally:
            for item in items:
                item.woken.set()

    def serve(self, item: Queued, serve_next: Callable[[], None], oldest: Callable[[], Queued | None]) -> None:
        """Returns once `item` is done: waits for its turn, then (serving) calls `serve_next()` (one
        call: take the oldest items and `carry` them) until the item is done, and hands the role on.
        An exception that escapes `serve_next` still hands the role on."""
        if not self.wait_turn(item):
            return
        try:
            while not item.done:
                serve_next()
        finally:
            self.hand_over(oldest)
