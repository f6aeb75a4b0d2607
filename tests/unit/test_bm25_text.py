"""Bm25Text: what Milvus' BM25 function indexes in schema-2 collections (the analysed context header
and text) and the query it is searched with."""

from __future__ import annotations

import re

from ragrpc.analyzer import EnglishAnalyzer
from ragrpc.context_header import bm25_text
from ragrpc.models import ChunkRecord
from ragrpc.store import schema as s
from ragrpc.store.bm25_text import Bm25Text, stored_terms


def _chunk(text: str, title: str = "", section_path: tuple[str, ...] = (), metadata: dict | None = None) -> ChunkRecord:
    return ChunkRecord(
        chunk_id="c1",
        document_id="d1",
        tenant="t",
        collection="default",
        generation="g1",
        text=text,
        vector=[],
        chunk_index=0,
        chunker="fixed_tokens",
        title=title,
        section_path=section_path,
        metadata=metadata or {},
    )


def test_document_terms_are_the_rank_bm25_analyzer_s_terms_of_header_and_text() -> None:
    chunk = _chunk(
        "Ducks were swimming in the ponds.",
        title="Wetland survey",
        section_path=("Birds",),
        metadata={"header_terms": "Acme Corp FY2017", "organization": "Not in the header"},
    )
    terms = Bm25Text(EnglishAnalyzer()).document(chunk).split(" ")
    assert terms == ["wetland", "survey", "acm", "corp", "fy2017", "bird", "duck", "swim", "pond"]


def test_without_context_headers_only_the_text_is_indexed() -> None:
    chunk = _chunk("Ducks were swimming.", title="Wetland survey")
    assert Bm25Text(EnglishAnalyzer(), context_headers=False).document(chunk) == "duck swim"


def test_terms_are_what_milvus_standard_tokenizer_splits_back_unchanged() -> None:
    """Runs of letters and digits, lowercase, one space apart: the standard tokenizer's words."""
    chunk = _chunk("Revenue (2023-Q2): $1,234.5m — naïve café, snake_case, Straße, 東京 data")
    terms = Bm25Text(EnglishAnalyzer()).document(chunk)
    assert terms and all(re.fullmatch(r"[^\W_]+", term) for term in terms.split(" "))
    assert terms == terms.lower()


def test_a_query_of_stop_words_has_no_terms() -> None:
    bm25 = Bm25Text(EnglishAnalyzer())
    assert bm25.query("what is the ...?") == ""
    assert bm25.query("Where do ducks swim?") == "duck swim"


def test_a_chunk_longer_than_the_field_is_cut_at_a_term_boundary_within_its_bytes() -> None:
    limit = s.VARCHAR_LIMITS[s.BM25_TEXT]
    word = "überlängenwort"  # 15 bytes in UTF-8 (two of its characters take two)
    chunk = _chunk(" ".join(f"{word}{i}" for i in range(limit // 10)))
    terms = Bm25Text(EnglishAnalyzer(), context_headers=False).document(chunk)
    assert len(terms.encode()) <= limit
    assert len(terms.encode()) > limit - 30  # nearly full: only the last term is dropped
    last = terms.split(" ")[-1]
    assert re.fullmatch(r"überlängenwort\d+", last)


def test_stored_terms_are_the_analyzer_s_terms_of_what_rank_bm25_indexes() -> None:
    """The query service's rank_bm25 index loads the stored field instead of analysing each chunk
    again: the terms must be exactly those it would have made (header included, any script)."""
    analyzer = EnglishAnalyzer()
    for chunk in (
        _chunk("Ducks were swimming in the ponds.", title="Wetland survey", section_path=("Birds",)),
        _chunk("Revenue (2023-Q2): $1,234.5m — naïve café, Straße, 東京 data", title="Q2"),
        _chunk("the of and", title=""),  # stop words only: no terms
        _chunk("", title=""),
    ):
        expected = tuple(analyzer.analyze(bm25_text(chunk, context_headers=True)))
        assert stored_terms(Bm25Text(analyzer).document(chunk)) == expected


def test_a_field_that_may_have_been_cut_is_not_trusted() -> None:
    """A field at its byte limit may have lost terms (`_cut`): the text is analysed instead."""
    long_text = " ".join(f"término{i}" for i in range(12_000))  # about 130 KB of terms
    field = Bm25Text(EnglishAnalyzer()).document(_chunk(long_text))
    assert len(field.encode()) <= s.VARCHAR_LIMITS[s.BM25_TEXT]
    assert stored_terms(field) is None
    short = Bm25Text(EnglishAnalyzer()).document(_chunk(" ".join(f"término{i}" for i in range(1_000))))
    assert stored_terms(short) is not None and len(stored_terms(short) or ()) == 1_000


def test_stored_terms_share_one_string_per_term_across_chunks() -> None:
    # the query service holds every chunk's terms until its start-up scan ends: each chunk's tuple must
    # point at one shared string per term, not a fresh copy (2-3 GB at 1M chunks)
    first = stored_terms(" ".join(["wetland", "duck"]))
    second = stored_terms("".join(["duck ", "wetland"]))
    assert first is not None and second is not None
    assert first[0] is second[1] and first[1] is second[0]


def test_the_document_workers_terms_are_written_as_the_store_would_analyse_them() -> None:
    """The ingest service's document workers analyse each draft's terms (ingest_service.preparation, an
    analyser built from the same settings); the records carry them and the store writes them as they are,
    the same field it would have derived itself."""
    import dataclasses

    import numpy as np

    from ingest_service.chunk_records import build_chunk_records
    from ingest_service.preparation import build_preparer
    from ingest_service.requests import DocumentSpecInput, IngestItem
    from ragrpc.config import Settings
    from ragrpc.tokens import WordTokenCounter

    settings = dataclasses.replace(Settings(), chunk_size_tokens=40, chunk_overlap_tokens=0)
    preparer = build_preparer(settings, WordTokenCounter(), 256, bm25_terms=True)
    text = "# Wetland survey\n\n## Birds\n\n" + " ".join(["Ducks were swimming in the ponds at dawn."] * 12)
    item = IngestItem("t", DocumentSpecInput(document_id="d1", file_name="survey.md"), text.encode())
    extracted, facts = preparer.extract(item, None)
    framed = preparer.frame(item, extracted, facts)
    assert len(framed.drafts) > 1 and framed.bm25_terms is not None
    vectors = np.zeros((len(framed.drafts), 4), dtype=np.float32)
    given = build_chunk_records(item, "d1", facts, framed.drafts, vectors, "g1", framed.bm25_terms)
    derived = build_chunk_records(item, "d1", facts, framed.drafts, vectors, "g1")
    store = Bm25Text(EnglishAnalyzer(), context_headers=settings.context_headers)
    assert all(record.bm25_terms for record in given) and all(record.bm25_terms is None for record in derived)
    assert [store.document(r) for r in given] == [store.document(r) for r in derived]
    assert [store.document(r) for r in derived] == [
        " ".join(EnglishAnalyzer().analyze(bm25_text(r, context_headers=True))) for r in derived
    ]
