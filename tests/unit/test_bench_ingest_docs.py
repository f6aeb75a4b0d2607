"""scripts.bench_ingest_docs without the heavy parts: the corpus, its passwords and the
IngestDocuments batches (each under the message limit, every document once)."""

from __future__ import annotations

import pytest

from scripts import bench_ingest_docs as bench

pytestmark = pytest.mark.skipif(not bench.DOCS.is_dir(), reason="shared eval docs not present")


def test_corpus_passwords_and_batches() -> None:
    corpus = bench.Corpus.load()
    assert set(corpus.files) == set(bench.KINDS) and sum(len(v) for v in corpus.files.values()) >= 98
    assert corpus.password(bench.DOCS / "pdf" / "pdfplumber__password-example.pdf") == "test"
    for kind, files in corpus.files.items():
        batches = bench._batches(corpus, kind)
        names = [d.spec.file_name for batch in batches for d in batch]
        assert names == [p.name for p in files]
        assert all(len(batch) == 1 or sum(len(d.content) for d in batch) <= bench.BATCH_BYTES for batch in batches)


def test_the_tables_print(capsys: pytest.CaptureFixture[str]) -> None:
    bench.print_extraction(bench.Row("PDF extraction", documents=2, active=1, refused=1, units=10, seconds=4.0))
    rows = [bench.Row("pdf", 2, 1, 1, 30, 2_000_000, 10.0), bench.Row("all documents", 2, 1, 1, 30, 2_000_000, 10.0)]
    bench.print_end_to_end(rows, bench.Row("model alone", documents=64, chunks=64, seconds=2.0))
    out = capsys.readouterr().out
    assert "2.5" in out and "3.0" in out and "32.0 chunks/s" in out
