"""Keeps the benchmark code (scripts/bench) from rotting: its quickest meaningful paths
in-process, without the embedding model or a Milvus server (< 60 s)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from ragrpc.testing import HashingEmbedder
from scripts.bench import report
from scripts.bench.__main__ import main as bench_main
from scripts.bench.common import BenchConfig, SectionResult, load_scifact, percentile, summary_ms
from scripts.bench.ingest import pdf_extraction
from scripts.bench.peers import bm25_peer, dense_peer
from scripts.bench.querydata import CHUNKS_PER_DOCUMENT, chunk_records

pytestmark = pytest.mark.slow

SHARED = Path(__file__).resolve().parents[3] / "shared" / "eval"
needs_shared = pytest.mark.skipif(not (SHARED / "ir" / "scifact").exists(), reason="shared eval data missing")


def test_percentiles_and_summary() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    stats = summary_ms([0.001] * 9 + [0.1])
    assert stats["p50"] == pytest.approx(1.0) and stats["p99"] > 50


def test_report_prints_tables_and_writes_json(tmp_path: Path) -> None:
    section = SectionResult("synthetic", seconds=1.5)
    section.add("speed", 123.456, "items/s", ratio=2.0, versus="baseline", note="a note")
    section.add("missing", None, "ms")
    section.notes.append("made up for the test")
    broken = SectionResult("broken", error="RuntimeError: boom")
    facts = report.machine_facts()
    out = io.StringIO()
    report.print_report([section, broken], facts, out)
    text = out.getvalue()
    assert "== synthetic" in text and "items/s" in text and "vs baseline" in text and "FAILED" in text
    assert f"{facts['cpu_count']} cores" in text
    path = tmp_path / "results.json"
    report.write_json(path, report.to_json([section, broken], facts, quick=True))
    payload = json.loads(path.read_text())
    assert payload["sections"]["synthetic"]["figures"][0]["value"] == pytest.approx(123.456)
    assert payload["machine"]["cpu_count"] == facts["cpu_count"]


def test_unknown_section_is_refused() -> None:
    with pytest.raises(SystemExit):
        bench_main(["--sections", "nonsense"])


@needs_shared
def test_peers_on_a_judged_subset() -> None:
    dataset = load_scifact(200)
    assert 150 <= len(dataset.corpus) <= 200 and dataset.judged_queries()
    bm25 = bm25_peer(dataset)
    assert 0.3 < bm25["ndcg@10"] <= 1.0 and bm25["latency_ms"]["p50"] > 0
    embedder = HashingEmbedder(dimension=64)
    texts = [d.full_text for d in dataset.corpus.values()]
    doc_vectors = embedder.embed_documents(texts)
    query_vectors = embedder.embed_documents(list(dataset.judged_queries().values()))
    dense = dense_peer(dataset, np.asarray(doc_vectors), np.asarray(query_vectors))
    assert 0.0 < dense["ndcg@10"] <= 1.0


@needs_shared
def test_pdf_extraction_counts_pages_and_skips_encrypted(tmp_path: Path) -> None:
    for name in ("pypdf__crazyones.pdf", "pypdf__encrypted-file.pdf", "pdfplumber__empty.pdf"):
        (tmp_path / name).symlink_to(SHARED / "docs" / "pdf" / name)
    stats = pdf_extraction(tmp_path)
    assert stats["documents"] == 1 and stats["pages"] >= 1 and stats["pages_per_s"] > 0
    assert set(stats["skipped"]) == {"pypdf__encrypted-file.pdf", "pdfplumber__empty.pdf"}


def test_bulk_rows_group_chunks_into_documents() -> None:
    texts = [f"text {i}" for i in range(CHUNKS_PER_DOCUMENT + 5)]
    vectors = np.eye(len(texts), 8, dtype=np.float32)
    rows = chunk_records(texts, vectors, 0, len(texts))
    assert len({r.chunk_id for r in rows}) == len(texts)
    assert rows[0].document_id != rows[-1].document_id and rows[-1].chunk_index == 4
    assert BenchConfig(quick=True).query_sizes == (1_000,)


def test_scale_report_rewrites_only_its_section(tmp_path: Path) -> None:
    from scripts.bench import bulk
    from scripts.bench.scale_report import BEGIN, END, write_report

    base = np.eye(4, 8, dtype=np.float32)
    vectors = np.concatenate(list(bulk.derived_vectors(base, 10)))
    assert vectors.shape == (10, 8) and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    timing = {"p50": 10.0, "p99": 20.0}
    rows = [
        {
            "backend": backend,
            "size": size,
            **{f"retrieve_{mode}_ms": timing for mode in ("dense", "sparse", "hybrid")},
            "store_dense_ms": timing,
            "exact_numpy_ms": timing,
            "dense_recall_at_10": 0.99,
            "retrieve_dense_recall_at_10": 1.0,
            "dense_search": "in_process" if backend == "milvus-lite" else "store",
            "serving_s": 1.0,
            "rss_per_chunk_bytes": 100.0,
            "stages_hybrid_ms": {"embed_query": 5.0, "dense_search": 3.0},
            **({"service_serving_s": 2.0, "service_rss_mib": 100.0} if size == 10_000 else {}),
        }
        for backend in ("milvus-lite", "milvus-2.3.5")
        for size in (1_000, 10_000)
    ]
    (tmp_path / "benchmarks.md").write_text(
        f"# Benchmarks\n\nkept above\n\n{BEGIN}\nthe previous section\n{END}\n\nkept below\n"
    )
    write_report(rows, tmp_path)
    text = (tmp_path / "benchmarks.md").read_text()
    assert "kept above" in text and "kept below" in text and "the previous section" not in text
    assert "| milvus-2.3.5 | 10,000 | store | 10.0 / 20.0 ms |" in text and "| embed_query | dense_search |" in text
    assert "| 2.0 s | 100 MiB (10,486 B) |" in text  # the fresh query service process, where it was measured
    assert "| 1.0 s (in the bench) | not measured |" in text
    assert (tmp_path / "scale.png").read_bytes().startswith(b"\x89PNG")


@needs_shared
def test_index_memory_section_measures_both_indexes_per_chunk() -> None:
    from scripts.bench import index_memory

    result = index_memory.run(BenchConfig(quick=True))
    for group in index_memory.GROUPS:
        figures = result.data[f"group_{group}"]
        assert 900 <= figures["chunks"] <= 1000
        # a chunk's terms (about 150) and 384 float32 at least; a copy of its text would be more
        assert 500 < figures["bm25_bytes_per_chunk"] < 20_000
        assert 384 * 4 < figures["dense_bytes_per_chunk"] < 20_000
        assert figures["bm25_search_p50_ms"] > 0
    # a document's chunks share their attributes: long documents cost less a chunk
    assert result.data["group_10"]["dense_bytes_per_chunk"] < result.data["group_1"]["dense_bytes_per_chunk"]
