"""Exact dense searches running at once share a pass over the held vectors (query_service.shared_passes):
the searches that wait while a pass runs are answered by the next one, each with its own column, per
set of vectors; a failed pass fails its own searches only; and through the in-process dense index,
searches answered together find what they find alone (recent rows, dead slots, filters, two tenants)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from query_service import dense_index
from query_service.dense_index import InProcessDenseIndex, VectorChunk
from query_service.shared_passes import SharedPasses
from ragrpc.store import schema as s

DIMENSION = 24


def _unit(rng: np.random.Generator, n: int) -> np.ndarray:
    vectors = rng.standard_normal((n, DIMENSION)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


class GatedVectors:
    """A matrix whose first pass waits until `release` is set (so that searches queue behind it)."""

    def __init__(self, matrix: np.ndarray, fail_with: Exception | None = None) -> None:
        self.matrix = matrix
        self.release = threading.Event()
        self.started = threading.Event()
        self.sizes: list[int] = []
        self.fail_with = fail_with

    def pass_over(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.sizes.append(len(queries))
        if len(self.sizes) == 1:
            self.started.set()
            assert self.release.wait(10)
        elif self.fail_with is not None:
            raise self.fail_with
        return np.arange(len(self.matrix)), self.matrix @ queries.T


def _wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _search_in_threads(
    passes: SharedPasses, jobs: list[tuple[GatedVectors, np.ndarray]]
) -> tuple[list[threading.Thread], dict[int, object]]:
    results: dict[int, object] = {}

    def search(number: int, vectors: GatedVectors, query: np.ndarray) -> None:
        try:
            results[number] = passes.scores(vectors, query, vectors.pass_over)
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            results[number] = exc

    threads = [threading.Thread(target=search, args=(n, v, q)) for n, (v, q) in enumerate(jobs)]
    for thread in threads:
        thread.start()
    return threads, results


def test_searches_that_wait_behind_a_pass_share_the_next_one_each_with_its_own_column() -> None:
    rng = np.random.default_rng(1)
    vectors = GatedVectors(_unit(rng, 500))
    queries = _unit(rng, 9)
    passes = SharedPasses()
    first, first_results = _search_in_threads(passes, [(vectors, queries[0])])
    assert vectors.started.wait(10)
    rest, results = _search_in_threads(passes, [(vectors, q) for q in queries[1:]])
    _wait_until(lambda: passes.waiting() == 8)
    vectors.release.set()
    for thread in [*first, *rest]:
        thread.join(10)
    assert vectors.sizes == [1, 8]  # the lone first search, then one pass for the eight that waited
    assert (passes.passes, passes.searches) == (2, 9)
    for number, query in enumerate(queries):
        slots, scores = (first_results if number == 0 else results)[0 if number == 0 else number - 1]  # type: ignore[misc]
        assert np.array_equal(slots, np.arange(500))
        np.testing.assert_allclose(scores, vectors.matrix @ query, rtol=0, atol=1e-6)


def test_a_pass_answers_one_set_of_vectors_and_at_most_max_queries() -> None:
    rng = np.random.default_rng(2)
    gate, tenant_a, tenant_b = (
        GatedVectors(_unit(rng, 10)),
        GatedVectors(_unit(rng, 300)),
        GatedVectors(_unit(rng, 200)),
    )
    tenant_a.sizes.append(0)  # no gate of their own: their first pass is not the blocked one
    tenant_b.sizes.append(0)
    passes = SharedPasses(max_queries=3)
    blocker, _ = _search_in_threads(passes, [(gate, _unit(rng, 1)[0])])
    assert gate.started.wait(10)
    jobs = [(tenant_a if n % 2 else tenant_b, q) for n, q in enumerate(_unit(rng, 8))]
    threads, results = _search_in_threads(passes, jobs)
    _wait_until(lambda: passes.waiting() == 8)
    gate.release.set()
    for thread in [*blocker, *threads]:
        thread.join(10)
    assert sorted(tenant_a.sizes[1:]) == [1, 3] and sorted(tenant_b.sizes[1:]) == [1, 3]
    for number, (vectors, query) in enumerate(jobs):
        slots, scores = results[number]  # type: ignore[misc]
        assert len(slots) == len(vectors.matrix)
        np.testing.assert_allclose(scores, vectors.matrix @ query, rtol=0, atol=1e-6)


def test_a_failed_pass_fails_its_own_searches_and_the_next_searches_are_answered() -> None:
    rng = np.random.default_rng(3)
    vectors = GatedVectors(_unit(rng, 100), fail_with=MemoryError("no room for the scores"))
    passes = SharedPasses()
    first, first_results = _search_in_threads(passes, [(vectors, _unit(rng, 1)[0])])
    assert vectors.started.wait(10)
    rest, results = _search_in_threads(passes, [(vectors, q) for q in _unit(rng, 4)])
    _wait_until(lambda: passes.waiting() == 4)
    vectors.release.set()
    for thread in [*first, *rest]:
        thread.join(10)
    assert not isinstance(first_results[0], Exception)
    assert all(isinstance(results[n], MemoryError) for n in range(4))
    vectors.fail_with = None
    query = _unit(rng, 1)[0]
    slots, scores = passes.scores(vectors, query, vectors.pass_over)  # the role was handed on, not kept
    np.testing.assert_allclose(scores, vectors.matrix @ query, rtol=0, atol=1e-6)


def _chunks(document: str, vectors: np.ndarray, tenant: str, tag: str) -> list[VectorChunk]:
    return [
        VectorChunk(
            f"{document}-{k}",
            vector,
            {s.CHUNK_ID: f"{document}-{k}", s.DOCUMENT_ID: document, s.TENANT: tenant, s.TAGS: (tag,)},
        )
        for k, vector in enumerate(vectors)
    ]


def test_index_searches_answered_together_find_what_they_find_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compact rows, recent rows and dead slots of two tenants, with and without a filter: 24 searches
    queued behind a held pass get the hits of the same searches run one at a time."""
    rng = np.random.default_rng(4)
    index = InProcessDenseIndex(DIMENSION, merge_min_chunks=256)
    for tenant in ("t1", "t2"):
        for d in range(300):  # past the merge threshold: a compact matrix, then recent rows
            index.replace_document(
                tenant,
                f"{tenant}-doc{d}",
                _chunks(f"{tenant}-doc{d}", _unit(rng, 1 + d % 3), tenant, "odd" if d % 2 else "even"),
            )
        for d in range(0, 300, 7):  # dead slots
            index.remove_document(tenant, f"{tenant}-doc{d}")
    searches = [(tenant, query, tag) for tenant in ("t1", "t2") for query in _unit(rng, 6) for tag in ("", "odd")]
    allow = {"": None, "odd": lambda attrs: "odd" in attrs[s.TAGS]}
    alone = [index.search(q, 10, tenant=t, allow=allow[tag]) for t, q, tag in searches]
    assert index.passes.passes == len(searches)  # one at a time: a pass each

    release, held = threading.Event(), threading.Event()
    real = dense_index._Scope.pass_over  # noqa: SLF001

    def held_first(scope: object, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not held.is_set():
            held.set()
            assert release.wait(10)
        return real(scope, queries)  # type: ignore[arg-type]

    monkeypatch.setattr(dense_index._Scope, "pass_over", held_first)  # noqa: SLF001
    before = index.passes.passes
    blocker = threading.Thread(target=index.search, args=(_unit(rng, 1)[0], 10), kwargs={"tenant": "t1"})
    blocker.start()
    assert held.wait(10)
    together: dict[int, list[tuple[str, float]]] = {}

    def search(number: int) -> None:
        tenant, query, tag = searches[number]
        together[number] = index.search(query, 10, tenant=tenant, allow=allow[tag])

    threads = [threading.Thread(target=search, args=(n,)) for n in range(len(searches))]
    for thread in threads:
        thread.start()
    _wait_until(lambda: index.passes.waiting() == len(searches))
    release.set()
    for thread in [blocker, *threads]:
        thread.join(10)
    assert index.passes.passes - before == 3  # the held one, then one pass per tenant
    for number, hits in enumerate(alone):
        assert [c for c, _ in together[number]] == [c for c, _ in hits]
        np.testing.assert_allclose([v for _, v in together[number]], [v for _, v in hits], rtol=0, atol=1e-6)


def test_searches_sharing_passes_while_documents_change_neither_stall_nor_return_removed_chunks() -> None:
    """Eight searching threads against a thread that replaces and removes documents (the index's writer
    waits for the searches in passes, and holds new ones back until it is done): every search returns,
    and never a chunk of a document that was removed before it started and not added back since."""
    rng = np.random.default_rng(5)
    index = InProcessDenseIndex(DIMENSION, merge_min_chunks=128, compaction_min_dead=64)
    for d in range(200):
        index.replace_document("t1", f"doc{d}", _chunks(f"doc{d}", _unit(rng, 2), "t1", "even"))
    gone = {f"doc{d}" for d in range(150, 200)}  # removed for good before any search starts
    for document in gone:
        index.remove_document("t1", document)
    stop = threading.Event()
    failures: list[str] = []
    searched = [0] * 8

    def search(number: int) -> None:
        local = np.random.default_rng(100 + number)
        while not stop.is_set():
            for chunk_id, _ in index.search(_unit(local, 1)[0], 20, tenant="t1"):
                if chunk_id.rsplit("-", 1)[0] in gone:
                    failures.append(chunk_id)
            searched[number] += 1

    def change() -> None:
        local = np.random.default_rng(200)
        for round_ in range(300):
            document = f"doc{local.integers(0, 150)}"
            if round_ % 3:
                index.replace_document("t1", document, _chunks(document, _unit(local, 1 + round_ % 4), "t1", "even"))
            else:
                index.remove_document("t1", document)
                index.replace_document("t1", document, _chunks(document, _unit(local, 2), "t1", "even"))

    searchers = [threading.Thread(target=search, args=(n,)) for n in range(8)]
    for thread in searchers:
        thread.start()
    changer = threading.Thread(target=change)
    changer.start()
    changer.join(60)
    stop.set()
    for thread in searchers:
        thread.join(60)
    assert not changer.is_alive() and not any(thread.is_alive() for thread in searchers)
    assert not failures
    assert all(searched) and index.passes.searches == sum(searched)
    assert index.passes.waiting() == 0
