"""ReadGroups: reads by key of one collection that wait behind a running read leave in one
call, and each caller gets exactly its own rows (or its own error)."""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable

import pytest

from ragrpc.store.read_groups import ReadGroups

STORED = {f"k{i}": {"id": f"k{i}", "value": i} for i in range(100)}


class GatedStore:
    """A store whose first call waits until released, so later reads queue behind it; it refuses
    keys marked bad and can play unreachable."""

    def __init__(self, unavailable: bool = False) -> None:
        self.calls: list[list[Hashable]] = []
        self.first_started = threading.Event()
        self.release = threading.Event()
        self.unavailable = unavailable

    def fetch(self, keys: list[Hashable]) -> list[dict]:
        self.calls.append(list(keys))
        if len(self.calls) == 1:
            self.first_started.set()
            assert self.release.wait(10)
        if self.unavailable:
            raise ConnectionError("failed to connect to all addresses")
        if any(str(k).startswith("bad") for k in keys):
            raise ValueError(f"malformed key among {keys}")
        return [STORED[k] for k in keys if k in STORED]


def _retry_unless_unavailable(exc: BaseException) -> bool:
    return not isinstance(exc, ConnectionError)


def _read_concurrently(groups: ReadGroups, store: GatedStore, reads: list[list[str]]) -> list[object]:
    """The first read starts and holds the store; the others queue behind it; then it is released."""
    results: list[object] = [None] * len(reads)

    def one(i: int) -> None:
        try:
            results[i] = groups.get("docs", reads[i], store.fetch, lambda r: r["id"], _retry_unless_unavailable)
        except Exception as exc:  # noqa: BLE001 - compared by the test
            results[i] = exc

    threads = [threading.Thread(target=one, args=(0,))]
    threads[0].start()
    assert store.first_started.wait(10)
    threads += [threading.Thread(target=one, args=(i,)) for i in range(1, len(reads))]
    for t in threads[1:]:
        t.start()
    deadline = time.monotonic() + 10
    while groups.waiting("docs") < len(reads) - 1:
        assert time.monotonic() < deadline, "the reads did not queue"
        time.sleep(0.001)
    store.release.set()
    for t in threads:
        t.join(10)
    return results


def test_reads_that_wait_behind_a_running_one_leave_in_one_call() -> None:
    groups, store = ReadGroups(), GatedStore()
    reads = [["k0"], ["k1", "k2"], ["k3"], ["k2", "missing"], ["k4"]]
    results = _read_concurrently(groups, store, reads)
    assert store.calls[0] == ["k0"]
    assert len(store.calls) == 2 and sorted(store.calls[1]) == ["k1", "k2", "k3", "k4", "missing"]  # no key twice
    assert results == [
        [STORED["k0"]],
        [STORED["k1"], STORED["k2"]],
        [STORED["k3"]],
        [STORED["k2"]],  # a missing key is simply absent
        [STORED["k4"]],
    ]
    assert (groups.calls, groups.reads) == (2, 5)


def test_a_call_holds_at_most_max_keys_but_always_one_read() -> None:
    groups, store = ReadGroups(max_keys=3), GatedStore()
    reads = [["k0"], ["k1", "k2"], ["k3", "k4"], ["k5", "k6", "k7", "k8"]]
    results = _read_concurrently(groups, store, reads)
    assert store.calls == [["k0"], ["k1", "k2"], ["k3", "k4"], ["k5", "k6", "k7", "k8"]]
    assert results[3] == [STORED[f"k{i}"] for i in range(5, 9)]


def test_a_bad_key_fails_only_its_own_reader() -> None:
    groups, store = ReadGroups(), GatedStore()
    results = _read_concurrently(groups, store, [["k0"], ["k1"], ["bad-1"], ["k2"]])
    assert results[0] == [STORED["k0"]]
    assert results[1] == [STORED["k1"]] and results[3] == [STORED["k2"]]
    assert isinstance(results[2], ValueError)
    assert store.calls[2:] == [["k1"], ["bad-1"], ["k2"]]  # the merged call failed, then each alone


def test_an_unreachable_store_fails_every_reader_without_retrying_each() -> None:
    groups, store = ReadGroups(), GatedStore(unavailable=True)
    results = _read_concurrently(groups, store, [["k0"], ["k1"], ["k2"]])
    assert all(isinstance(r, ConnectionError) for r in results)
    assert len(store.calls) == 2


def test_no_keys_make_no_call_and_max_keys_must_be_positive() -> None:
    groups, store = ReadGroups(), GatedStore()
    assert groups.get("docs", [], store.fetch, lambda r: r["id"], _retry_unless_unavailable) == []
    assert store.calls == []
    with pytest.raises(ValueError):
        ReadGroups(max_keys=0)


def test_readers_on_many_threads_each_get_their_own_rows() -> None:
    groups = ReadGroups(max_keys=16)
    calls = 0
    lock = threading.Lock()

    def fetch(keys: list[Hashable]) -> list[dict]:
        nonlocal calls
        with lock:
            calls += 1
        time.sleep(0.002)
        return [STORED[k] for k in keys if k in STORED]

    results: dict[int, list[dict]] = {}

    def one(i: int) -> None:
        results[i] = groups.get("docs", [f"k{i}", f"k{(i + 1) % 100}"], fetch, lambda r: r["id"], lambda e: True)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(60)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert all(results[i] == [STORED[f"k{i}"], STORED[f"k{(i + 1) % 100}"]] for i in range(60))
    assert calls == groups.calls < 60  # some reads shared a call


def test_reads_of_other_fields_are_not_merged_and_each_gets_its_own_fields() -> None:
    """The call of a batch is made with one caller's fetch: a read asking for other fields (the BM25
    terms, the vectors) queued behind a plain one must not leave in its call, or it gets rows without
    them (seen on 2026-12-08: the query service's registry follower failed on rows lacking the terms)."""
    groups, store = ReadGroups(), GatedStore()

    def with_terms(keys: list[Hashable]) -> list[dict]:
        return [{**row, "terms": f"t{row['value']}"} for row in store.fetch(keys)]

    results: dict[str, object] = {}

    def read(name: str, keys: list[str], fetch, fields: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
        results[name] = groups.get("docs", keys, fetch, lambda r: r["id"], _retry_unless_unavailable, fields=fields)

    first = threading.Thread(target=read, args=("first", ["k0"], store.fetch, ("value",)))
    first.start()
    assert store.first_started.wait(10)
    queued = [
        threading.Thread(target=read, args=("plain", ["k1"], store.fetch, ("value",))),
        threading.Thread(target=read, args=("terms-1", ["k2"], with_terms, ("value", "terms"))),
        threading.Thread(target=read, args=("terms-2", ["k3"], with_terms, ("value", "terms"))),
    ]
    for t in queued:
        t.start()
    deadline = time.monotonic() + 10
    # the plain read queues behind the running one; the reads with terms have a queue of their own, so
    # they do not wait for its call at all
    while groups.waiting("docs", ("value",)) < 1 or not {"terms-1", "terms-2"} <= results.keys():
        assert time.monotonic() < deadline, "the plain read did not queue, or the reads with terms waited"
        time.sleep(0.001)
    assert "plain" not in results
    store.release.set()
    for t in [first, *queued]:
        t.join(10)
    assert results["first"] == [STORED["k0"]] and results["plain"] == [STORED["k1"]]
    assert results["terms-1"] == [{**STORED["k2"], "terms": "t2"}]
    assert results["terms-2"] == [{**STORED["k3"], "terms": "t3"}]
    assert ["k1"] in store.calls and not any("k1" in call and len(call) > 1 for call in store.calls)
