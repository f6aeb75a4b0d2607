"""Coarse partitions of the held vectors (query_service.coarse_partitions) and the dense index's
search over them: near exact on clustered vectors, exact where every list is probed or a filter
passes too few of the probed rows, kept in step through removals, additions and compactions, and
carried by a snapshot (one without them is refused where they are wanted)."""

from __future__ import annotations

import numpy as np
import pytest

from query_service.coarse_partitions import EXACT, CoarsePartitions, PartitionPolicy, nearest_centroid
from query_service.dense_index import InProcessDenseIndex, VectorChunk, WithoutPartitions
from ragrpc.store import schema as s

DIMENSION = 24


def _clustered(rng: np.random.Generator, n: int, centres: np.ndarray) -> np.ndarray:
    """Unit vectors around `centres` (as a text collection's topics are)."""
    picked = centres[rng.integers(0, len(centres), n)]
    vectors = picked + 0.08 * rng.standard_normal((n, centres.shape[1])).astype(np.float32)
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


def _centres(rng: np.random.Generator, count: int = 40) -> np.ndarray:
    centres = rng.standard_normal((count, DIMENSION)).astype(np.float32)
    return centres / np.linalg.norm(centres, axis=1, keepdims=True)


def _chunks(document: str, vectors: np.ndarray, tag: str = "") -> list[VectorChunk]:
    return [
        VectorChunk(
            f"{document}-{k}",
            vector,
            {s.CHUNK_ID: f"{document}-{k}", s.DOCUMENT_ID: document, s.TENANT: "t1", s.TAGS: (tag,) if tag else ()},
        )
        for k, vector in enumerate(vectors)
    ]


def _exact(held: dict[str, np.ndarray], query: np.ndarray, k: int) -> list[str]:
    ids = [f"{doc}-{n}" for doc, matrix in held.items() for n in range(len(matrix))]
    scores = np.concatenate(list(held.values())) @ query
    order = sorted(range(len(ids)), key=lambda i: (-scores[i], ids[i]))
    return [ids[i] for i in order[:k]]


def _filled(policy: PartitionPolicy, documents: int = 1500, seed: int = 1) -> tuple[InProcessDenseIndex, dict]:
    rng = np.random.default_rng(seed)
    centres = _centres(rng)
    index = InProcessDenseIndex(DIMENSION, partitions=policy, merge_min_chunks=512)
    held = {}
    for d in range(documents):  # 1-3 chunks each
        held[f"doc{d}"] = _clustered(rng, 1 + d % 3, centres)
        index.replace_document("t1", f"doc{d}", _chunks(f"doc{d}", held[f"doc{d}"], tag="rare" if d % 300 == 7 else ""))
    return index, held


def test_rows_are_laid_out_list_by_list_and_map_back_to_their_slots() -> None:
    rng = np.random.default_rng(0)
    vectors = _clustered(rng, 5000, _centres(rng))
    lists = PartitionPolicy().lists_for(len(vectors))
    centroids = CoarsePartitions.train(lambda rows: vectors[rows], len(vectors), lists)
    assert lists == 141 and centroids.shape == (141, DIMENSION)
    assignment = nearest_centroid(vectors, centroids)
    partitions = CoarsePartitions.laid_out(centroids, assignment)
    assert np.array_equal(np.sort(partitions.row_slot), np.arange(5000))
    assert np.array_equal(partitions.row_slot[partitions.slot_row], np.arange(5000))
    assert np.array_equal(partitions.lists_of_rows(partitions.slot_row), assignment)  # each slot in its list
    assert np.all(np.diff(assignment[partitions.row_slot]) >= 0)  # the rows go list by list
    assert partitions.offsets[0] == 0 and partitions.offsets[-1] == 5000
    nearest = partitions.nearest_lists(vectors[0], 3)
    assert assignment[0] in nearest and len(set(nearest)) == 3
    assert partitions.nearest_lists(vectors[0], 10_000) == list(range(141))
    assert PartitionPolicy().probes(2000) == 200 and PartitionPolicy(probe_percent=0.01).probes(9) == 1


def test_a_compaction_keeps_every_row_in_its_nearest_list_and_each_row_with_its_slot() -> None:
    index, held = _filled(PartitionPolicy(min_chunks=1000, probe_percent=10))
    rng = np.random.default_rng(2)
    centres = _centres(np.random.default_rng(1))
    for d in range(0, 1500, 3):
        index.remove_document("t1", f"doc{d}")
        del held[f"doc{d}"]
    for d in range(1500, 1800):
        held[f"doc{d}"] = _clustered(rng, 2, centres)
        index.replace_document("t1", f"doc{d}", _chunks(f"doc{d}", held[f"doc{d}"]))
    index.compact()
    scope = index._scopes["t1"]  # noqa: SLF001 - the layout itself is what is checked
    partitions = scope.partitions
    assert partitions is not None and partitions.rows == len(scope.compact) == index.chunk_count("t1")
    by_chunk = {f"{doc}-{k}": vector for doc, matrix in held.items() for k, vector in enumerate(matrix)}
    for row in range(0, partitions.rows, 7):
        assert np.array_equal(scope.compact[row], by_chunk[scope.slots.chunk_id(int(partitions.row_slot[row]))])
    nearest = np.argmax(scope.compact @ partitions.centroids.T, axis=1)
    assert np.array_equal(nearest, partitions.lists_of_rows(np.arange(partitions.rows)))


def test_search_over_partitions_is_near_exact_and_exact_with_every_list_probed() -> None:
    index, held = _filled(PartitionPolicy(min_chunks=1000, probe_percent=8))
    index.compact()
    scope = index._scopes["t1"]  # noqa: SLF001 - whether partitions were built is what is checked
    assert scope.partitions is not None and scope.partitions.rows == index.chunk_count("t1") == 3000
    rng = np.random.default_rng(9)
    queries = _clustered(rng, 40, _centres(np.random.default_rng(1)))
    recall = np.mean(
        [len({c for c, _ in index.search(q, 10, tenant="t1")} & set(_exact(held, q, 10))) / 10 for q in queries]
    )
    assert recall >= 0.9  # 9 of 110 lists probed
    everything = InProcessDenseIndex.restore(
        *index.export(), partitions=PartitionPolicy(min_chunks=1000, probe_percent=100)
    )
    for query in queries[:10]:
        assert [c for c, _ in everything.search(query, 10, tenant="t1")] == _exact(held, query, 10)


def test_removed_documents_never_come_back_and_recent_rows_are_always_searched() -> None:
    index, held = _filled(PartitionPolicy(min_chunks=1000, probe_percent=4))
    index.compact()
    for d in range(0, 1500, 2):  # half removed: dead compact slots behind the partitions
        index.remove_document("t1", f"doc{d}")
        del held[f"doc{d}"]
    fresh = _clustered(np.random.default_rng(4), 3, _centres(np.random.default_rng(1)))
    index.replace_document("t1", "fresh", _chunks("fresh", fresh))  # a recent row: no partition yet
    held["fresh"] = fresh
    for k, vector in enumerate(fresh):
        got = [c for c, _ in index.search(vector, 5, tenant="t1")]
        assert got[0] == f"fresh-{k}"
        assert all(int(c.split("-")[0][3:]) % 2 == 1 for c in got if c.startswith("doc"))
    index.compact()  # the removed rows go, the fresh ones join their lists
    scope = index._scopes["t1"]  # noqa: SLF001
    assert scope.partitions is not None and scope.partitions.rows == index.chunk_count("t1")
    for k, vector in enumerate(fresh):
        assert index.search(vector, 1, tenant="t1")[0][0] == f"fresh-{k}"


def test_a_filter_that_passes_too_few_probed_rows_searches_every_row() -> None:
    index, held = _filled(PartitionPolicy(min_chunks=1000, probe_percent=2))
    index.compact()
    rare = {doc: matrix for doc, matrix in held.items() if int(doc[3:]) % 300 == 7}  # 5 documents, 10 chunks
    for query in _clustered(np.random.default_rng(5), 10, _centres(np.random.default_rng(1))):
        got = index.search(query, 8, tenant="t1", allow=lambda attrs: "rare" in attrs[s.TAGS])
        assert [c for c, _ in got] == _exact(rare, query, 8)
        restricted = index.search(query, 3, tenant="t1", document_ids=["doc10", "doc11"])  # always exact
        assert [c for c, _ in restricted] == _exact({d: held[d] for d in ("doc10", "doc11")}, query, 3)


def test_partitions_come_and_go_with_the_tenant_s_size_and_are_retrained_when_outgrown() -> None:
    policy = PartitionPolicy(min_chunks=1000, probe_percent=4)
    index, held = _filled(policy, documents=300)  # 600 chunks: under the minimum
    index.compact()
    assert index._scopes["t1"].partitions is None  # noqa: SLF001
    rng = np.random.default_rng(6)
    centres = _centres(np.random.default_rng(1))
    for d in range(300, 900):
        held[f"doc{d}"] = _clustered(rng, 2, centres)
        index.replace_document("t1", f"doc{d}", _chunks(f"doc{d}", held[f"doc{d}"]))
    index.compact()
    first = index._scopes["t1"].partitions  # noqa: SLF001
    assert first is not None and first.rows == 1800  # trained on the way (past 1,000), carried since
    assert not policy.outgrown(first, 1800)
    for d in range(900, 4500):  # 9,000 chunks: lists_for() more than twice the lists trained
        held[f"doc{d}"] = _clustered(rng, 2, centres)
        index.replace_document("t1", f"doc{d}", _chunks(f"doc{d}", held[f"doc{d}"]))
    index.compact()
    grown = index._scopes["t1"].partitions  # noqa: SLF001
    assert grown is not None and grown.rows == 9000 and grown.lists > 2 * first.lists  # retrained on the way
    assert not policy.outgrown(grown, 9000)
    for d in range(4500):
        if d % 10:
            index.remove_document("t1", f"doc{d}")
    index.compact()
    assert index.chunk_count("t1") < 1000 and index._scopes["t1"].partitions is None  # noqa: SLF001


def test_a_snapshot_carries_the_partitions_and_one_without_them_is_refused_where_they_are_wanted() -> None:
    policy = PartitionPolicy(min_chunks=1000, probe_percent=5)
    index, held = _filled(policy)
    meta, arrays = index.export()
    assert meta["format"] == 3 and meta["scopes"][0]["partitions"]
    queries = _clustered(np.random.default_rng(8), 10, _centres(np.random.default_rng(1)))
    expected = [index.search(q, 10, tenant="t1") for q in queries]
    restored = InProcessDenseIndex.restore(meta, arrays, partitions=policy)
    assert [restored.search(q, 10, tenant="t1") for q in queries] == expected
    # an export without partitions (format 1, before them): refused where the policy wants them
    exact_meta, exact_arrays = _filled(EXACT)[0].export()  # the same chunks, slot by slot
    assert exact_meta["scopes"][0]["partitions"] is False
    old_meta = {**exact_meta, "format": 1}
    with pytest.raises(WithoutPartitions, match="RAGRPC_DENSE_PARTITIONS_MIN_CHUNKS=1000"):
        InProcessDenseIndex.restore(old_meta, exact_arrays, partitions=policy)
    exact = InProcessDenseIndex.restore(old_meta, exact_arrays, partitions=EXACT)
    assert [c for c, _ in exact.search(queries[0], 10, tenant="t1")] == _exact(held, queries[0], 10)
    laid_out = InProcessDenseIndex.restore(meta, arrays, partitions=EXACT)  # rows list by list, searched exactly
    assert laid_out._scopes["t1"].partitions is not None  # noqa: SLF001
    for query in queries:
        assert [c for c, _ in laid_out.search(query, 10, tenant="t1")] == _exact(held, query, 10)


@pytest.mark.parametrize(
    ("name", "damage", "message"),
    [
        ("row_slot", lambda a: a[::-1][1:], "rows of shape"),
        ("row_slot", lambda a: np.where(a == 0, 1, a).astype(np.int32), "permutation"),
        ("row_slot", lambda a: np.where(a == 0, 10**6, a).astype(np.int32), "past the table"),
        ("offsets", lambda a: np.concatenate((a[:1], a[2:3] + 1, a[1:2], a[3:])), "backwards"),
        ("offsets", lambda a: a[:-1], "do not span"),
        ("centroids", lambda a: a[:, :-1], "dimension"),
        ("centroids", lambda a: a.astype(np.float64), "float32"),
    ],
)
def test_partition_arrays_that_do_not_fit_the_vectors_are_refused(name: str, damage, message: str) -> None:
    index, _ = _filled(PartitionPolicy(min_chunks=1000, probe_percent=5), documents=700)
    meta, arrays = index.export()
    key = f"s0/partitions/{name}"
    broken = {**arrays, key: damage(np.array(arrays[key]))}
    with pytest.raises(ValueError, match=message):
        InProcessDenseIndex.restore(meta, broken, partitions=PartitionPolicy(min_chunks=1000, probe_percent=5))


def test_a_policy_that_no_search_could_use_is_refused() -> None:
    for percent in (0, -5, 100.5, float("nan")):
        with pytest.raises(ValueError, match="at most 100"):
            PartitionPolicy(probe_percent=percent)
    with pytest.raises(ValueError, match="0 \\(never\\)"):
        PartitionPolicy(min_chunks=-1)
    with pytest.raises(ValueError, match="square root"):
        PartitionPolicy(lists_per_sqrt=0)
    assert PartitionPolicy(lists_per_sqrt=0.5).lists_for(10_000) == 50


def test_settings_no_search_could_use_stop_the_service_naming_the_variable() -> None:
    import dataclasses

    from query_service.app import partition_policy
    from ragrpc import errors
    from ragrpc.config import Settings

    assert partition_policy(Settings()) == PartitionPolicy(min_chunks=200_000, probe_percent=10.0)
    for change in ({"dense_partitions_probe_percent": 0.0}, {"dense_partitions_min_chunks": -1}):
        with pytest.raises(errors.PreconditionError, match="RAGRPC_DENSE_PARTITIONS_PROBE_PERCENT"):
            partition_policy(dataclasses.replace(Settings(), **change))


def test_assignment_and_layout_past_their_batch_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A compaction reads, assigns and copies rows in batches (32k and 64k rows at a time): with batches of
    97 rows, 3,000 chunks cross many batch boundaries, and every row still holds its slot's vector."""
    from query_service import coarse_partitions, dense_index

    monkeypatch.setattr(coarse_partitions, "_ASSIGN_BATCH", 97)
    monkeypatch.setattr(dense_index, "_COPY_BATCH", 97)
    index, held = _filled(PartitionPolicy(min_chunks=1000, probe_percent=100))
    index.compact()
    scope = index._scopes["t1"]  # noqa: SLF001 - the layout itself is what is checked
    partitions = scope.partitions
    assert partitions is not None and partitions.rows == 3000
    by_chunk = {f"{doc}-{k}": vector for doc, matrix in held.items() for k, vector in enumerate(matrix)}
    for row in range(partitions.rows):
        assert np.array_equal(scope.compact[row], by_chunk[scope.slots.chunk_id(int(partitions.row_slot[row]))])
    nearest = np.argmax(scope.compact @ partitions.centroids.T, axis=1)
    assert np.array_equal(nearest, partitions.lists_of_rows(np.arange(partitions.rows)))
    query = next(iter(held.values()))[0]
    assert [c for c, _ in index.search(query, 10, tenant="t1")] == _exact(held, query, 10)
