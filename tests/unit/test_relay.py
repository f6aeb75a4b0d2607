"""The relay of grouped calls (ragrpc.store.relay) through WriteGroups.write: one caller at a time
makes the calls, oldest queued write first; the others sleep until their own rows are written;
the role passes on when the serving caller's own write is done, and nothing is left queued
without a caller to send it."""

from __future__ import annotations

import random
import threading
import time

import pytest

from ragrpc.store.group_commit import WriteGroups
from ragrpc.store.relay import Queued, Relay

DOCS = ("upsert", "docs")
CHUNKS = ("insert", "chunks")


class Stop(BaseException):
    """Not an Exception: what escapes a store call when the interpreter is stopping."""


class GatedStore:
    """Records each call's rows and the thread that made it; its first call waits until released,
    so later writes queue behind it. One call at a time is checked, not assumed."""

    def __init__(self, raise_first: BaseException | None = None) -> None:
        self.calls: list[list[str]] = []
        self.callers: list[int] = []
        self.first_started = threading.Event()
        self.release = threading.Event()
        self.raise_first = raise_first
        self._inside = 0
        self.overlapped = False

    def write(self, rows: list[dict]) -> None:
        self._inside += 1
        self.overlapped |= self._inside > 1
        try:
            self.calls.append([row["id"] for row in rows])
            self.callers.append(threading.get_ident())
            if len(self.calls) == 1:
                self.first_started.set()
                assert self.release.wait(10)
                if self.raise_first is not None:
                    raise self.raise_first
            time.sleep(0.001)
        finally:
            self._inside -= 1


def _retry_unless_unavailable(exc: BaseException) -> bool:
    return not isinstance(exc, ConnectionError)


class Callers:
    """Threads that each write one group's rows through WriteGroups.write."""

    def __init__(self, groups: WriteGroups, store: GatedStore) -> None:
        self.groups, self.store = groups, store
        self.writer_lock = threading.Lock()
        self.outcome: dict[str, BaseException | None] = {}
        self.thread_of: dict[str, int] = {}
        self.threads: list[threading.Thread] = []

    def start(self, group: tuple[str, str], *ids: str) -> None:
        def run() -> None:
            self.thread_of[ids[0]] = threading.get_ident()
            try:
                self.groups.write(
                    group,
                    [{"id": i} for i in ids],
                    "id",
                    self.store.write,
                    _retry_unless_unavailable,
                    self.writer_lock,
                )
                self.outcome[ids[0]] = None
            except BaseException as exc:  # noqa: BLE001 - compared by the test
                self.outcome[ids[0]] = exc

        thread = threading.Thread(target=run)
        self.threads.append(thread)
        thread.start()

    def queued(self, group: tuple[str, str], count: int) -> None:
        deadline = time.monotonic() + 10
        while self.groups.waiting(group) < count:
            assert time.monotonic() < deadline, "the writes did not queue"
            time.sleep(0.001)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(10)
            assert not thread.is_alive(), "a caller never returned"


def test_a_lone_caller_makes_its_own_call() -> None:
    groups, store = WriteGroups(), GatedStore()
    store.release.set()
    callers = Callers(groups, store)
    callers.start(DOCS, "a")
    callers.join()
    assert store.calls == [["a"]] and callers.outcome == {"a": None}
    assert store.callers == [callers.thread_of["a"]]


def test_writes_queued_behind_a_call_leave_in_the_next_one_made_by_the_oldest_waiting_caller() -> None:
    groups, store = WriteGroups(), GatedStore()
    callers = Callers(groups, store)
    callers.start(DOCS, "first")
    assert store.first_started.wait(10)
    for n in range(8):
        callers.start(DOCS, f"w{n}")
        callers.queued(DOCS, n + 1)  # in this order
    store.release.set()
    callers.join()
    assert store.calls == [["first"], [f"w{n}" for n in range(8)]]
    assert store.callers == [callers.thread_of["first"], callers.thread_of["w0"]]
    assert all(exc is None for exc in callers.outcome.values()) and len(callers.outcome) == 9
    assert not store.overlapped


def test_the_role_passes_to_the_oldest_queued_write_across_groups() -> None:
    groups, store = WriteGroups(), GatedStore()
    callers = Callers(groups, store)
    callers.start(DOCS, "d0")
    assert store.first_started.wait(10)
    callers.start(CHUNKS, "c1")
    callers.queued(CHUNKS, 1)
    callers.start(DOCS, "d2")
    callers.queued(DOCS, 1)
    callers.start(CHUNKS, "c3")
    callers.queued(CHUNKS, 2)
    store.release.set()
    callers.join()
    # d0's caller hands over to c1's (the oldest queued), which sends its whole group, then d2's
    assert store.calls == [["d0"], ["c1", "c3"], ["d2"]]
    assert store.callers == [callers.thread_of[k] for k in ("d0", "c1", "d2")]
    assert all(exc is None for exc in callers.outcome.values())


def test_a_base_exception_in_a_call_answers_its_callers_and_the_role_passes_on() -> None:
    groups, store = WriteGroups(), GatedStore(raise_first=Stop())
    callers = Callers(groups, store)
    callers.start(DOCS, "doomed")
    assert store.first_started.wait(10)
    callers.start(DOCS, "next")
    callers.queued(DOCS, 1)
    store.release.set()
    callers.join()
    assert isinstance(callers.outcome["doomed"], Stop)
    assert callers.outcome["next"] is None
    assert store.calls == [["doomed"], ["next"]]


def test_a_failed_merged_call_fails_only_the_bad_writes_caller() -> None:
    class Refusing(GatedStore):
        def write(self, rows: list[dict]) -> None:
            super().write(rows)
            if any(row["id"] == "bad" for row in rows):
                raise ValueError("a row does not fit the schema")

    groups, store = WriteGroups(), Refusing()
    callers = Callers(groups, store)
    callers.start(DOCS, "first")
    assert store.first_started.wait(10)
    for ids in (("a",), ("bad",), ("b",)):
        callers.start(DOCS, *ids)
        callers.queued(DOCS, len(callers.threads) - 1)
    store.release.set()
    callers.join()
    assert store.calls == [["first"], ["a", "bad", "b"], ["a"], ["bad"], ["b"]]
    assert isinstance(callers.outcome.pop("bad"), ValueError)
    assert all(exc is None for exc in callers.outcome.values())


def test_many_callers_over_many_groups_each_write_lands_once_one_call_at_a_time() -> None:
    groups, store = WriteGroups(max_rows=16), GatedStore()
    store.release.set()
    writer_lock = threading.Lock()
    kinds = [DOCS, CHUNKS, ("upsert", "jobs")]
    failures: list[BaseException] = []

    def caller(n: int) -> None:
        rng = random.Random(n)
        for k in range(25):
            rows = [{"id": f"t{n}-{k}-{i}"} for i in range(rng.randint(1, 6))]
            try:
                groups.write(
                    rng.choice(kinds),
                    rows,
                    "id",
                    store.write,
                    _retry_unless_unavailable,
                    writer_lock,
                    linger=(lambda: time.sleep(0.0005)) if rng.random() < 0.3 else None,
                )
            except BaseException as exc:  # noqa: BLE001
                failures.append(exc)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(48)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive(), "a caller never returned: a write was left without a server"
    assert failures == []
    written = [row for call in store.calls for row in call]
    assert len(written) == len(set(written))  # none twice
    assert groups.calls == len(store.calls) < groups.writes == 48 * 25
    assert not store.overlapped


def test_a_relay_item_that_is_done_before_its_turn_does_not_serve() -> None:
    relay = Relay()
    item = Queued()
    item.done = True
    calls: list[int] = []
    relay.serve(item, lambda: calls.append(1), lambda: None)
    assert calls == []


def test_a_server_whose_queue_lost_its_item_fails_loudly() -> None:
    groups = WriteGroups()
    pending = groups.enqueue(DOCS, [{"id": "x"}], "id", lambda rows: None)
    assert groups.take(DOCS) == [pending]  # taken behind the relay's back: nothing left to serve
    with pytest.raises(RuntimeError, match="neither queued nor written"):
        groups._serve_next(_retry_unless_unavailable, threading.Lock())  # noqa: SLF001
