"""WriteGroups: queued row writes of one kind leave in one call, in order, and each caller
gets its own outcome."""

from __future__ import annotations

import threading

import pytest

from ragrpc.store.group_commit import WriteGroups

GROUP = ("upsert", "docs")


class RecordingStore:
    """A store that keeps the rows of every call it receives and refuses rows marked bad."""

    def __init__(self, unavailable: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.unavailable = unavailable

    def write(self, rows: list[dict]) -> None:
        self.calls.append([row["id"] for row in rows])
        if self.unavailable:
            raise ConnectionError("failed to connect to all addresses")
        bad = [row["id"] for row in rows if row.get("bad")]
        if bad:
            raise ValueError(f"rows {bad} do not fit the schema")


def _retry_unless_unavailable(exc: BaseException) -> bool:
    return not isinstance(exc, ConnectionError)


def _rows(*ids: str, bad: str = "") -> list[dict]:
    return [{"id": i, "bad": i == bad} for i in ids]


def test_queued_writes_leave_in_one_call_in_order() -> None:
    groups = WriteGroups()
    store = RecordingStore()
    pending = [groups.enqueue(GROUP, _rows(f"a{i}", f"b{i}"), "id") for i in range(3)]
    batch = groups.take(GROUP)
    groups.send(batch, store.write, _retry_unless_unavailable)
    assert store.calls == [["a0", "b0", "a1", "b1", "a2", "b2"]]
    assert all(p.done and p.error is None for p in pending)
    assert (groups.calls, groups.writes) == (1, 3)
    assert groups.take(GROUP) == []


def test_groups_are_per_operation_and_collection() -> None:
    groups = WriteGroups()
    groups.enqueue(("upsert", "docs"), _rows("a"), "id")
    groups.enqueue(("insert", "docs"), _rows("b"), "id")
    groups.enqueue(("upsert", "jobs"), _rows("c"), "id")
    assert [p.rows[0]["id"] for p in groups.take(("upsert", "docs"))] == ["a"]
    assert [p.rows[0]["id"] for p in groups.take(("insert", "docs"))] == ["b"]
    assert [p.rows[0]["id"] for p in groups.take(("upsert", "jobs"))] == ["c"]


def test_a_repeated_key_starts_a_new_call() -> None:
    groups = WriteGroups()
    first = groups.enqueue(GROUP, _rows("k1", "k2"), "id")
    second = groups.enqueue(GROUP, _rows("k3"), "id")
    again = groups.enqueue(GROUP, _rows("k2"), "id")  # the same record written again: must land after `first`
    assert groups.take(GROUP) == [first, second]
    assert groups.take(GROUP) == [again]


def test_a_call_holds_at_most_max_rows_but_always_one_write() -> None:
    groups = WriteGroups(max_rows=4)
    big = groups.enqueue(GROUP, _rows(*[f"r{i}" for i in range(6)]), "id")
    small = [groups.enqueue(GROUP, _rows(f"s{i}", f"t{i}"), "id") for i in range(3)]
    assert groups.take(GROUP) == [big]  # larger than the cap alone: still sent
    assert groups.take(GROUP) == small[:2]
    assert groups.take(GROUP) == small[2:]
    with pytest.raises(ValueError):
        WriteGroups(max_rows=0)


def test_a_bad_row_fails_only_its_own_caller() -> None:
    groups = WriteGroups()
    store = RecordingStore()
    good = groups.enqueue(GROUP, _rows("a"), "id")
    bad = groups.enqueue(GROUP, _rows("b", "c", bad="c"), "id")
    other = groups.enqueue(GROUP, _rows("d"), "id")
    groups.send(groups.take(GROUP), store.write, _retry_unless_unavailable)
    assert store.calls == [["a", "b", "c", "d"], ["a"], ["b", "c"], ["d"]]
    assert good.error is None and other.error is None
    assert isinstance(bad.error, ValueError) and "['c']" in str(bad.error)
    assert all(p.done for p in (good, bad, other))


def test_an_unreachable_store_fails_every_caller_without_retrying_each() -> None:
    groups = WriteGroups()
    store = RecordingStore(unavailable=True)
    pending = [groups.enqueue(GROUP, _rows(f"a{i}"), "id") for i in range(3)]
    groups.send(groups.take(GROUP), store.write, _retry_unless_unavailable)
    assert store.calls == [["a0", "a1", "a2"]]
    assert all(isinstance(p.error, ConnectionError) and p.done for p in pending)


def test_callers_on_many_threads_each_see_their_rows_written_once() -> None:
    groups = WriteGroups(max_rows=16)
    store = RecordingStore()
    writer = threading.Lock()
    results: dict[int, bool] = {}

    def caller(n: int) -> None:
        pending = groups.enqueue(GROUP, _rows(f"x{n}a", f"x{n}b"), "id")
        with writer:  # the one writer, as MilvusConnection.write_rows holds it
            while not pending.done:
                groups.send(groups.take(GROUP), store.write, _retry_unless_unavailable)
        results[n] = pending.error is None

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    written = [row for call in store.calls for row in call]
    assert sorted(written) == sorted(f"x{n}{s}" for n in range(40) for s in "ab")
    assert all(results.values()) and len(results) == 40
    assert all(len(call) <= 16 for call in store.calls)
    assert groups.writes == 40 and groups.calls == len(store.calls)
