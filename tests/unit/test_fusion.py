"""Tests of RRF and weighted fusion with hand-computed values."""

from __future__ import annotations

import random

import pytest

from query_service.fusion import Fusion, RrfFusion, WeightedFusion, min_max_normalise
from ragrpc.errors import InvalidInputError
from ragrpc.models import ChunkRecord, ScoredChunk, StageScores


def hit(chunk_id: str, score: float) -> ScoredChunk:
    chunk = ChunkRecord(
        chunk_id=chunk_id,
        document_id="d",
        tenant="t",
        collection="c",
        generation="g",
        text=f"text of {chunk_id}",
        vector=[],
        chunk_index=0,
        chunker="test",
    )
    return ScoredChunk(chunk=chunk, score=score)


def ids(hits: list[ScoredChunk]) -> list[str]:
    return [h.chunk.chunk_id for h in hits]


def test_rrf_sums_reciprocal_ranks() -> None:
    dense = [hit("a", 0.9), hit("b", 0.8), hit("c", 0.7)]
    sparse = [hit("c", 12.0), hit("d", 7.0), hit("a", 3.0)]
    fused = RrfFusion(k=60).fuse(dense, sparse)
    # a: 1/61 + 1/63 = 0.032266; c: 1/63 + 1/61 (same); b: 1/62 = 0.016129; d: 1/62 (same)
    assert ids(fused) == ["a", "c", "b", "d"]
    expected = {"a": 1 / 61 + 1 / 63, "c": 1 / 63 + 1 / 61, "b": 1 / 62, "d": 1 / 62}
    for h in fused:
        assert h.score == pytest.approx(expected[h.chunk.chunk_id], abs=1e-15)
        assert h.scores.fused == h.score
    by_id = {h.chunk.chunk_id: h.scores for h in fused}
    assert by_id["a"] == StageScores(dense=0.9, sparse=3.0, fused=pytest.approx(0.0322664, abs=1e-7))
    assert by_id["b"].sparse is None and by_id["d"].dense is None
    assert by_id["d"].sparse == 7.0


def test_rrf_k_changes_the_weights_of_ranks() -> None:
    fused = RrfFusion(k=1).fuse([hit("a", 1.0), hit("b", 0.5)], [hit("b", 2.0)])
    # a: 1/2 = 0.5; b: 1/3 + 1/2 = 0.8333
    assert [(h.chunk.chunk_id, round(h.score, 4)) for h in fused] == [("b", 0.8333), ("a", 0.5)]


def test_rrf_counts_a_repeated_chunk_once_at_its_best_rank() -> None:
    fused = RrfFusion(k=10).fuse([hit("a", 0.9), hit("a", 0.5), hit("b", 0.4)], [])
    assert [(h.chunk.chunk_id, h.score) for h in fused] == [("a", 1 / 11), ("b", 1 / 13)]
    assert fused[0].scores.dense == 0.9


def test_weighted_fusion_min_max_normalises_each_list() -> None:
    dense = [hit("a", 0.9), hit("b", 0.7), hit("c", 0.5)]
    sparse = [hit("b", 20.0), hit("d", 15.0), hit("a", 10.0)]
    fused = WeightedFusion(dense_weight=0.7, sparse_weight=0.3).fuse(dense, sparse)
    # dense normalised: a 1.0, b 0.5, c 0.0; sparse normalised: b 1.0, d 0.5, a 0.0
    # a = 0.7; b = 0.35 + 0.3 = 0.65; d = 0.15; c = 0.0
    assert [(h.chunk.chunk_id, round(h.score, 10)) for h in fused] == [
        ("a", 0.7),
        ("b", 0.65),
        ("d", 0.15),
        ("c", 0.0),
    ]
    assert fused[1].scores == StageScores(dense=0.7, sparse=20.0, fused=pytest.approx(0.65))


def test_weighted_fusion_single_item_or_equal_scores_normalise_to_one() -> None:
    fused = WeightedFusion(0.5, 0.5).fuse([hit("a", 0.2)], [hit("b", 3.0), hit("c", 3.0)])
    # a: 0.5 * 1.0; b, c: 0.5 * 1.0 each -> all 0.5, ties broken by chunk_id
    assert [(h.chunk.chunk_id, h.score) for h in fused] == [("a", 0.5), ("b", 0.5), ("c", 0.5)]


def test_min_max_normalise() -> None:
    assert min_max_normalise([]) == []
    assert min_max_normalise([5.0]) == [1.0]
    assert min_max_normalise([2.0, 2.0]) == [1.0, 1.0]
    assert min_max_normalise([1.0, 3.0, 2.0]) == [0.0, 1.0, 0.5]


def test_ties_are_broken_by_chunk_id_whatever_the_input_order() -> None:
    for fusion in (RrfFusion(), WeightedFusion(0.5, 0.5)):
        first = fusion.fuse([hit("z", 1.0)], [hit("m", 1.0)])
        second = fusion.fuse([hit("m", 1.0)], [hit("z", 1.0)])
        assert ids(first) == ids(second) == ["m", "z"]
        assert first[0].score == first[1].score


def test_empty_lists_and_only_one_list() -> None:
    for fusion in (RrfFusion(), WeightedFusion()):
        assert fusion.fuse([], []) == []
        only_sparse = fusion.fuse([], [hit("a", 2.0), hit("b", 1.0)])
        assert ids(only_sparse) == ["a", "b"]
        assert all(h.scores.dense is None for h in only_sparse)


def test_a_limit_returns_the_head_of_the_full_ranking() -> None:
    """A query reads only its top-k of ~200 fused candidates: with `limit` only the head is built, and it
    is exactly the unlimited ranking's head (ties by chunk_id included: many candidates share a score)."""
    rng = random.Random(7)
    for trial in range(30):
        pool = [f"c{i:03d}" for i in range(rng.randint(0, 60))]
        dense = [hit(c, round(rng.random(), 1)) for c in rng.sample(pool, k=min(len(pool), rng.randint(0, 40)))]
        sparse = [hit(c, round(rng.uniform(0, 20), 0)) for c in rng.sample(pool, k=min(len(pool), rng.randint(0, 40)))]
        dense.sort(key=lambda h: -h.score)
        sparse.sort(key=lambda h: -h.score)
        for fusion in (RrfFusion(k=rng.randint(1, 60)), WeightedFusion(rng.random() + 0.1, rng.random())):
            full = fusion.fuse(dense, sparse)
            for limit in (0, 1, 5, len(full) - 1, len(full), len(full) + 3):
                if limit < 0:
                    continue
                head = fusion.fuse(dense, sparse, limit)
                assert [(h.chunk.chunk_id, h.score, h.scores, h.complete) for h in head] == [
                    (h.chunk.chunk_id, h.score, h.scores, h.complete) for h in full[:limit]
                ], (trial, type(fusion).__name__, limit)


def test_a_negative_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="limit"):
        RrfFusion().fuse([hit("a", 1.0)], [], -1)


def test_inputs_are_not_modified() -> None:
    dense = [hit("a", 0.9)]
    RrfFusion().fuse(dense, [hit("a", 1.0)])
    assert dense[0].score == 0.9 and dense[0].scores == StageScores()


def test_both_fusers_satisfy_the_protocol() -> None:
    fusers: list[Fusion] = [RrfFusion(), WeightedFusion()]
    assert all(callable(f.fuse) for f in fusers)


@pytest.mark.parametrize("k", [0, -1, True, 1.5])
def test_rrf_rejects_bad_k(k) -> None:
    with pytest.raises(InvalidInputError) as info:
        RrfFusion(k=k)
    assert info.value.field_violations[0][0] == "options.rrf_k"


@pytest.mark.parametrize(
    ("dense_weight", "sparse_weight"),
    [(-0.1, 0.3), (0.7, float("nan")), (float("inf"), 0.3), (0.0, 0.0), (True, 0.3)],
)
def test_weighted_fusion_rejects_bad_weights(dense_weight, sparse_weight) -> None:
    with pytest.raises(InvalidInputError):
        WeightedFusion(dense_weight, sparse_weight)
