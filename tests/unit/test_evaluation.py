"""Tests of BEIR loading, ranking metrics and page-level metrics (hand-computed values)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ragrpc.evaluation import (
    PageHit,
    PageTarget,
    doc_ranking_from_chunks,
    document_at_k,
    evaluate,
    evaluate_pages,
    load_beir,
    load_qrels,
    mrr_at_k,
    ndcg_at_k,
    page_at_k,
    page_mrr_at_k,
    recall_at_k,
)
from ragrpc.models import ChunkRecord, ScoredChunk

IR_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "eval" / "ir"


def test_ndcg_with_graded_gains() -> None:
    judgments = {"a": 2, "b": 1, "c": 0}
    # ranking b, x, a: DCG = 1/log2(2) + 2/log2(4) = 1 + 1 = 2; IDCG = 2/1 + 1/log2(3) = 2.63093
    assert ndcg_at_k(["b", "x", "a"], judgments, 10) == pytest.approx(2 / (2 + 1 / math.log2(3)))
    assert ndcg_at_k(["a", "b"], judgments, 10) == pytest.approx(1.0)
    # cut at 1: DCG = 1 (b); IDCG@1 = 2
    assert ndcg_at_k(["b", "a"], judgments, 1) == pytest.approx(0.5)
    assert ndcg_at_k(["c", "x"], judgments, 10) == 0.0
    assert ndcg_at_k(["a"], {"a": 0}, 10) == 0.0  # nothing relevant judged


def test_ndcg_ideal_is_cut_at_k() -> None:
    judgments = {d: 1 for d in "abcdef"}
    # 2 relevant in top 2 of 6 relevant: DCG = IDCG@2
    assert ndcg_at_k(["a", "b", "x"], judgments, 2) == pytest.approx(1.0)


def test_recall_and_mrr() -> None:
    judgments = {"a": 1, "b": 2, "c": 1, "z": 0}
    assert recall_at_k(["x", "b", "z", "a"], judgments, 3) == pytest.approx(1 / 3)
    assert recall_at_k(["x", "b", "z", "a"], judgments, 4) == pytest.approx(2 / 3)
    assert mrr_at_k(["x", "z", "c"], judgments, 10) == pytest.approx(1 / 3)
    assert mrr_at_k(["x", "z", "c"], judgments, 2) == 0.0
    assert recall_at_k(["a"], {"a": 0}, 10) == 0.0


def test_a_duplicated_document_counts_once() -> None:
    judgments = {"a": 1, "b": 1}
    assert recall_at_k(["a", "a", "b"], judgments, 2) == 1.0
    assert ndcg_at_k(["a", "a", "b"], judgments, 2) == pytest.approx(1.0)


def test_evaluate_averages_over_judged_queries_only() -> None:
    qrels = {"q1": {"a": 1}, "q2": {"b": 1, "c": 1}}
    run = {"q1": ["a"], "q2": ["x", "c"], "q3": ["whatever"]}
    result = evaluate(run, qrels, k_values=(1, 10))
    # q1: ndcg 1, recall 1, mrr 1. q2@10: DCG = 1/log2(3); IDCG = 1 + 1/log2(3); recall 0.5; mrr 0.5
    q2_ndcg = (1 / math.log2(3)) / (1 + 1 / math.log2(3))
    assert result["ndcg@10"] == pytest.approx((1 + q2_ndcg) / 2)
    assert result["recall@10"] == pytest.approx(0.75)
    assert result["mrr@10"] == pytest.approx(0.75)
    assert result["ndcg@1"] == pytest.approx(0.5) and result["recall@1"] == pytest.approx(0.5)
    assert evaluate({}, qrels)["ndcg@10"] == 0.0  # judged queries without a run count as 0
    with pytest.raises(ValueError):
        evaluate(run, {})


def chunk_hit(document_id: str, chunk_id: str, score: float) -> ScoredChunk:
    chunk = ChunkRecord(
        chunk_id=chunk_id,
        document_id=document_id,
        tenant="t",
        collection="c",
        generation="g",
        text="",
        vector=[],
        chunk_index=0,
        chunker="test",
    )
    return ScoredChunk(chunk=chunk, score=score)


def test_doc_ranking_uses_each_documents_best_chunk() -> None:
    hits = [
        chunk_hit("d1", "c1", 0.5),
        chunk_hit("d2", "c2", 0.9),
        chunk_hit("d1", "c3", 0.95),
        chunk_hit("d3", "c4", 0.5),
        chunk_hit("d4", "c5", 0.5),
    ]
    assert doc_ranking_from_chunks(hits) == ["d1", "d2", "d3", "d4"]
    assert doc_ranking_from_chunks([]) == []


def test_load_beir_from_a_small_directory(tmp_path: Path) -> None:
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.part1.jsonl").write_text(json.dumps({"_id": "2", "title": "", "text": "two"}) + "\n")
    (tmp_path / "corpus.part0.jsonl").write_text(json.dumps({"_id": "1", "title": "One", "text": "first"}) + "\n\n")
    (tmp_path / "queries.jsonl").write_text(
        json.dumps({"_id": "q1", "text": "which?"}) + "\n" + json.dumps({"_id": "q2", "text": "none"}) + "\n"
    )
    (tmp_path / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\nq1\t2\t2\nq1\t1\t0\n")
    dataset = load_beir(tmp_path, split="dev")
    assert list(dataset.corpus) == ["1", "2"]
    assert dataset.corpus["1"].full_text == "One first" and dataset.corpus["2"].full_text == "two"
    assert dataset.queries == {"q1": "which?", "q2": "none"}
    assert dataset.qrels == {"q1": {"2": 2, "1": 0}}
    assert dataset.judged_queries() == {"q1": "which?"}
    with pytest.raises(FileNotFoundError):
        load_beir(tmp_path / "missing")


def test_load_cisi() -> None:
    directory = IR_DATA / "cisi"
    if not directory.exists():
        pytest.skip(f"{directory} not available")
    dataset = load_beir(directory, split="test")
    assert len(dataset.corpus) == 1460
    assert len(dataset.queries) == 112
    assert len(dataset.judged_queries()) == 76
    assert sum(len(judged) for judged in dataset.qrels.values()) == 3114
    assert set().union(*dataset.qrels.values()) <= set(dataset.corpus)
    assert dataset.corpus["1"].title == "18 Editions of the Dewey Decimal Classifications"
    assert load_qrels(directory / "qrels" / "test.tsv") == dataset.qrels


# --- page-level metrics (look-alike documents) ---------------------------------------------


def test_document_and_page_at_k_with_page_ranges() -> None:
    target = PageTarget("report", 4)
    hits = [
        PageHit("other", 4, 4),  # right page number, wrong document
        PageHit("report", 1, 2),  # right document, wrong pages
        PageHit("report", 3, 5),  # a chunk spanning pages 3..5 holds page 4
    ]
    assert document_at_k(hits, target, 1) == 0.0
    assert document_at_k(hits, target, 2) == 1.0
    assert page_at_k(hits, target, 2) == 0.0
    assert page_at_k(hits, target, 3) == 1.0
    assert page_mrr_at_k(hits, target, 10) == pytest.approx(1 / 3)
    assert page_mrr_at_k(hits, target, 2) == 0.0
    assert page_at_k([], target, 5) == 0.0 and document_at_k([], target, 5) == 0.0


def test_page_ranges_are_inclusive_and_pageless_hits_hold_no_page() -> None:
    assert PageHit("d", 2, 2).holds("d", 2)
    assert PageHit("d", 2, 3).holds("d", 3) and not PageHit("d", 2, 3).holds("d", 4)
    assert not PageHit("d", 0, 0).holds("d", 0)  # formats without pages
    assert not PageHit("d", 0, 0).holds("d", 1)


def test_hits_count_at_their_own_rank_not_deduplicated() -> None:
    # five chunks of the right document on wrong pages push the right page out of the top 5
    target = PageTarget("d", 9)
    hits = [PageHit("d", p, p) for p in range(1, 6)] + [PageHit("d", 9, 9)]
    assert document_at_k(hits, target, 1) == 1.0
    assert page_at_k(hits, target, 5) == 0.0 and page_at_k(hits, target, 10) == 1.0
    assert page_mrr_at_k(hits, target, 10) == pytest.approx(1 / 6)


def test_evaluate_pages_averages_over_the_questions() -> None:
    targets = {"q1": PageTarget("a", 1), "q2": PageTarget("b", 2), "q3": PageTarget("c", 3)}
    runs = {
        "q1": [PageHit("a", 1, 1)],  # right page first
        "q2": [PageHit("a", 2, 2), PageHit("b", 1, 1), PageHit("b", 2, 2)],  # doc at 2, page at 3
        "q9": [PageHit("c", 3, 3)],  # not a question; q3 is missing and scores 0
    }
    result = evaluate_pages(runs, targets)
    assert set(result) == {"doc@1", "doc@5", "page@5", "page@10", "mrr@10"}
    assert result["doc@1"] == pytest.approx(1 / 3)
    assert result["doc@5"] == pytest.approx(2 / 3)
    assert result["page@5"] == pytest.approx(2 / 3) and result["page@10"] == pytest.approx(2 / 3)
    assert result["mrr@10"] == pytest.approx((1 + 1 / 3) / 3)
    custom = evaluate_pages(runs, targets, document_k=(2,), page_k=(1,), mrr_k=2)
    assert custom == pytest.approx({"doc@2": 2 / 3, "page@1": 1 / 3, "mrr@2": 1 / 3})
    with pytest.raises(ValueError):
        evaluate_pages(runs, {})
