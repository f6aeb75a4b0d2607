"""Tests of MMR diversification."""

from __future__ import annotations

import numpy as np
import pytest

from query_service.diversity import MmrDiversifier
from ragrpc.errors import InvalidInputError
from ragrpc.models import ChunkRecord, ScoredChunk


def hit(chunk_id: str, score: float) -> ScoredChunk:
    chunk = ChunkRecord(
        chunk_id=chunk_id,
        document_id="d",
        tenant="t",
        collection="c",
        generation="g",
        text=chunk_id,
        vector=[],
        chunk_index=0,
        chunker="test",
    )
    return ScoredChunk(chunk=chunk, score=score)


def unit_rows(*rows: list[float]) -> np.ndarray:
    matrix = np.asarray(rows, dtype=np.float64)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


def ids(hits: list[ScoredChunk]) -> list[str]:
    return [h.chunk.chunk_id for h in hits]


def test_near_duplicates_do_not_fill_the_top_k() -> None:
    candidates = [hit("dup1", 0.95), hit("dup2", 0.94), hit("dup3", 0.93), hit("other", 0.80), hit("third", 0.70)]
    embeddings = unit_rows([1, 0, 0], [1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1])
    # relevance 1, .96, .92, .4, 0: after dup1, other (0.2) beats dup2 (0.48 - 0.5 = -0.02); then third (0.0)
    picked = MmrDiversifier(0.5).diversify(candidates, embeddings, top_k=3)
    assert ids(picked) == ["dup1", "other", "third"]


def test_hand_computed_mmr_order() -> None:
    # relevance 1.0, 0.5, 0.0 after min-max; cos(a, b) = 0.8, cos(a, c) = 0, cos(b, c) = 0.6
    candidates = [hit("a", 3.0), hit("b", 2.0), hit("c", 1.0)]
    embeddings = np.array([[1.0, 0.0, 0.0], [0.8, 0.6, 0.0], [0.0, 1.0, 0.0]])
    # lambda 0.6: pick a; then b: 0.6*0.5 - 0.4*0.8 = -0.02, c: 0 - 0 = 0 -> c; then b
    assert ids(MmrDiversifier(0.6).diversify(candidates, embeddings, 3)) == ["a", "c", "b"]
    # lambda 0.8: b: 0.4 - 0.16 = 0.24, c: 0.0 -> b, then c
    assert ids(MmrDiversifier(0.8).diversify(candidates, embeddings, 3)) == ["a", "b", "c"]


def test_lambda_one_keeps_relevance_order() -> None:
    rng = np.random.default_rng(3)
    scores = rng.random(20)
    candidates = [hit(f"c{i}", float(s)) for i, s in enumerate(scores)]
    embeddings = unit_rows(*rng.normal(size=(20, 8)).tolist())
    picked = MmrDiversifier(1.0).diversify(candidates, embeddings, top_k=10)
    expected = [f"c{i}" for i in np.argsort(-scores, kind="stable")[:10]]
    assert ids(picked) == expected


def test_equal_relevance_and_lambda_zero_prefer_novelty() -> None:
    candidates = [hit("a", 1.0), hit("b", 1.0), hit("c", 1.0)]
    embeddings = unit_rows([1, 0], [1, 0.01], [0, 1])
    assert ids(MmrDiversifier(0.0).diversify(candidates, embeddings, 2)) == ["a", "c"]


def test_top_k_larger_than_candidates_and_empty_input() -> None:
    candidates = [hit("a", 1.0), hit("b", 0.5)]
    assert len(MmrDiversifier(0.5).diversify(candidates, unit_rows([1, 0], [0, 1]), top_k=10)) == 2
    assert MmrDiversifier(0.5).diversify([], np.zeros((0, 4)), top_k=5) == []
    assert MmrDiversifier(0.5).diversify(candidates, unit_rows([1, 0], [0, 1]), top_k=0) == []


def test_returns_the_candidate_objects_unchanged() -> None:
    candidates = [hit("a", 2.0), hit("b", 1.0)]
    picked = MmrDiversifier(0.7).diversify(candidates, unit_rows([1, 0], [0, 1]), 2)
    assert picked[0] is candidates[0] and picked[0].score == 2.0


def test_embedding_rows_must_match_candidates() -> None:
    with pytest.raises(ValueError):
        MmrDiversifier(0.5).diversify([hit("a", 1.0)], unit_rows([1, 0], [0, 1]), 1)


@pytest.mark.parametrize("lambda_", [-0.1, 1.1, float("nan"), True])
def test_lambda_outside_zero_one_is_rejected(lambda_) -> None:
    with pytest.raises(InvalidInputError) as info:
        MmrDiversifier(lambda_)
    assert info.value.field_violations[0][0] == "options.mmr_lambda"
