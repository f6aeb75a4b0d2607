"""The bm25_scale bench's own parts (scripts/bench/bm25_scale.py): its exact reference is rank_bm25's
formula, its corpus is the scale section's (variants included), and a small run of its measurements
holds together (recall 1.0 against the reference, a snapshot that loads in a fresh process)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from rank_bm25 import BM25Okapi

from query_service.sparse_index import InProcessBm25Index
from ragrpc.analyzer import EnglishAnalyzer
from scripts.bench import bm25_scale

POOL = [
    "Mallards are the most common ducks in the northern hemisphere.",
    "Ducks swim on ponds and eat water plants.",
    "Mute swans live on lakes and rivers.",
    "Geese migrate south in winter in large flocks.",
    "Herons stand still in shallow water to catch fish.",
]
QUERIES = ["ducks on ponds", "swans on lakes", "water birds in winter"]


def _chunks(size: int) -> list:
    analyzer = EnglishAnalyzer()
    return bm25_scale._corpus(size, POOL, [analyzer.analyze(text) for text in POOL])  # noqa: SLF001


def test_the_reference_is_rank_bm25_and_its_top_breaks_ties_by_chunk_id() -> None:
    chunks = _chunks(23)  # the pool, then variants 1..3 (each with "variant" and its number)
    assert list(chunks[6].terms or ()) == [*EnglishAnalyzer().analyze(POOL[1]), "variant", "1"]
    reference = bm25_scale._ExactBm25(chunks)  # noqa: SLF001
    okapi = BM25Okapi([list(c.terms or ()) for c in chunks])
    for query in QUERIES:
        terms = EnglishAnalyzer().analyze(query)
        assert np.allclose(reference.scores(terms), okapi.get_scores(terms), rtol=1e-12, atol=1e-12)
    top = reference.top(EnglishAnalyzer().analyze("ducks"), 3)
    scores = dict(zip([c.chunk_id for c in chunks], reference.scores(["duck"]), strict=True))
    assert [scores[c] for c in top] == sorted((scores[c] for c in top), reverse=True)
    assert bm25_scale._check_reference(chunks, [EnglishAnalyzer().analyze(q) for q in QUERIES]) < 1e-9  # noqa: SLF001


def test_a_small_run_measures_recall_one_and_a_snapshot_a_fresh_process_loads(tmp_path: Path) -> None:
    chunks = _chunks(400)
    index, build = bm25_scale._build(lambda: InProcessBm25Index(EnglishAnalyzer()), chunks)  # noqa: SLF001
    assert build["build_s"] > 0 and index.chunk_count("default") == 400
    recall = bm25_scale._recall(index, bm25_scale._ExactBm25(chunks), QUERIES)  # noqa: SLF001
    assert recall == {"recall_at_10": 1.0, "identical_top10": 1.0}
    latencies = bm25_scale._latencies(index, QUERIES)  # noqa: SLF001
    assert 0 < latencies["top10_p50_ms"] <= latencies["top10_p99_ms"]
    snapshot = bm25_scale._snapshot(index, QUERIES, tmp_path / "snapshots")  # noqa: SLF001
    assert snapshot["bytes"] > 0 and snapshot["load_s"] > 0 and snapshot["updates_found"] >= 2
    assert snapshot["rss_after_load"]["RssAnon"] - snapshot["rss_before"]["RssAnon"] < 16 * 2**20


@pytest.mark.parametrize("seed", [1, 2])
def test_the_corpus_variants_are_what_the_analyzer_makes_of_the_variant_texts(seed: int) -> None:
    size = random.Random(seed).randint(6, 40)
    analyzer = EnglishAnalyzer()
    for i, chunk in enumerate(_chunks(size)):
        k = i // len(POOL)
        text = POOL[i % len(POOL)] + (f" (variant {k})" if k else "")
        assert list(chunk.terms or ()) == analyzer.analyze(text)
        assert chunk.attrs["document_id"] == f"doc-{i:07d}"
