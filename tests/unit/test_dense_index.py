"""The in-process dense index: exact (the same top-k as numpy over the same vectors), per tenant,
with filters, document restrictions, replacement, removal and compaction."""

from __future__ import annotations

import numpy as np
import pytest

from query_service.dense_index import InProcessDenseIndex, VectorChunk
from ragrpc.store import schema as s

DIMENSION = 16


def _unit(rng: np.random.Generator, n: int) -> np.ndarray:
    vectors = rng.standard_normal((n, DIMENSION)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _chunks(document: str, vectors: np.ndarray, tenant: str = "t1", tag: str = "") -> list[VectorChunk]:
    return [
        VectorChunk(
            f"{document}-{k}",
            vector,
            {s.CHUNK_ID: f"{document}-{k}", s.DOCUMENT_ID: document, s.TENANT: tenant, s.TAGS: (tag,) if tag else ()},
        )
        for k, vector in enumerate(vectors)
    ]


def _exact(ids: list[str], matrix: np.ndarray, query: np.ndarray, k: int) -> list[str]:
    scores = matrix @ query
    order = sorted(range(len(ids)), key=lambda i: (-scores[i], ids[i]))
    return [ids[i] for i in order[:k]]


@pytest.mark.parametrize("merge_min_chunks", [16384, 64])
def test_search_is_exact_per_tenant_and_after_removals_and_compaction(merge_min_chunks: int) -> None:
    """With the default thresholds most rows stay recent; with 64, compactions fold them on the way."""
    rng = np.random.default_rng(7)
    index = InProcessDenseIndex(DIMENSION, merge_min_chunks=merge_min_chunks)
    kept: dict[str, np.ndarray] = {}
    for d in range(600):  # 600 documents of 1-5 chunks: 1,800 or so, past the first capacity
        vectors = _unit(rng, 1 + d % 5)
        index.replace_document("t1", f"doc{d}", _chunks(f"doc{d}", vectors))
        kept[f"doc{d}"] = vectors
    index.replace_document("t2", "other", _chunks("other", _unit(rng, 50), tenant="t2"))
    for d in range(0, 600, 3):  # a third removed, then some replaced: dead slots, then a compaction
        assert index.remove_document("t1", f"doc{d}")
        del kept[f"doc{d}"]
    for d in range(1, 600, 2):
        if f"doc{d}" in kept:
            kept[f"doc{d}"] = _unit(rng, 2)
            index.replace_document("t1", f"doc{d}", _chunks(f"doc{d}", kept[f"doc{d}"]))
    ids = [f"{doc}-{k}" for doc, vectors in kept.items() for k in range(len(vectors))]
    matrix = np.concatenate(list(kept.values()))
    assert index.chunk_count("t1") == len(ids)
    for query in _unit(rng, 20):
        got = [chunk_id for chunk_id, _ in index.search(query, 10, tenant="t1")]
        assert got == _exact(ids, matrix, query, 10)
    assert all(chunk_id.startswith("other") for chunk_id, _ in index.search(_unit(rng, 1)[0], 5, tenant="t2"))
    assert index.search(_unit(rng, 1)[0], 5, tenant="nobody") == []
    assert not index.remove_document("t1", "doc0")  # already gone


@pytest.mark.parametrize("compact_first", [False, True])
def test_filters_and_document_restrictions_keep_the_exact_order(compact_first: bool) -> None:
    rng = np.random.default_rng(3)
    index = InProcessDenseIndex(DIMENSION)
    vectors = {f"doc{d}": _unit(rng, 3) for d in range(400)}
    for d, (document, matrix) in enumerate(vectors.items()):
        index.replace_document("t1", document, _chunks(document, matrix, tag="rare" if d % 50 == 0 else "common"))
        if compact_first and d == 10:  # doc0..doc10 compact, the others recent
            index.compact()
    query = _unit(rng, 1)[0]
    rare = [doc for d, doc in enumerate(vectors) if d % 50 == 0]  # 8 documents, 24 chunks: past the first head
    got = index.search(query, 20, tenant="t1", allow=lambda attrs: "rare" in attrs[s.TAGS])
    ids = [f"{doc}-{k}" for doc in rare for k in range(3)]
    assert [c for c, _ in got] == _exact(ids, np.concatenate([vectors[d] for d in rare]), query, 20)
    chosen = ["doc5", "doc17", "missing"]
    got = index.search(query, 4, tenant="t1", document_ids=chosen)
    ids = [f"{doc}-{k}" for doc in chosen[:2] for k in range(3)]
    assert [c for c, _ in got] == _exact(ids, np.concatenate([vectors[d] for d in chosen[:2]]), query, 4)
    scores = dict(index.search(query, 3, tenant="t1"))
    assert all(-1.0 <= score <= 1.0 for score in scores.values())


def test_a_vector_of_another_dimension_is_refused() -> None:
    index = InProcessDenseIndex(DIMENSION)
    with pytest.raises(ValueError, match="dimension"):
        index.replace_document("t1", "d", [VectorChunk("d-0", [0.0] * (DIMENSION + 1), {})])
    index.replace_document("t1", "d", [])  # no chunks: nothing to hold
    assert index.chunk_count("t1") == 0


def test_removed_slots_are_compacted_once_they_outnumber_the_live_ones() -> None:
    rng = np.random.default_rng(11)
    index = InProcessDenseIndex(DIMENSION)
    vectors = {f"doc{d}": _unit(rng, 2) for d in range(1500)}
    for document, matrix in vectors.items():
        index.replace_document("t1", document, _chunks(document, matrix))
    for d in range(1100):
        index.remove_document("t1", f"doc{d}")
    scope = index._scopes["t1"]  # noqa: SLF001 - the compaction itself is what is checked
    assert scope.slots.dead_slots < 1100 * 2 and scope.slots.size < 3000  # compacted on the way
    left = {doc: m for doc, m in vectors.items() if int(doc[3:]) >= 1100}
    ids = [f"{doc}-{k}" for doc in left for k in range(2)]
    query = _unit(rng, 1)[0]
    assert [c for c, _ in index.search(query, 10, tenant="t1")] == _exact(
        ids, np.concatenate(list(left.values())), query, 10
    )
    assert [c for c, _ in index.search(query, 2, tenant="t1", document_ids=["doc1400"])] == _exact(
        ["doc1400-0", "doc1400-1"], vectors["doc1400"], query, 2
    )


def test_attributes_are_read_with_the_index_s_own_ids_and_compaction_keeps_them() -> None:
    rng = np.random.default_rng(5)
    index = InProcessDenseIndex(DIMENSION)
    chunks = _chunks("doc", _unit(rng, 3), tag="x")
    index.replace_document("t1", "doc", chunks)
    seen: list[dict] = []
    index.search(chunks[0].vector, 3, tenant="t1", allow=lambda attrs: seen.append(dict(attrs)) or True)
    index.compact()
    index.search(chunks[0].vector, 3, tenant="t1", allow=lambda attrs: seen.append(dict(attrs)) or True)
    assert len(seen) == 6 and all(attrs[s.TENANT] == "t1" and attrs[s.DOCUMENT_ID] == "doc" for attrs in seen)
    assert {attrs[s.CHUNK_ID] for attrs in seen} == {"doc-0", "doc-1", "doc-2"}
    assert all(attrs[s.TAGS] == ("x",) for attrs in seen)
    assert index.memory_bytes() >= 3 * DIMENSION * 4
