"""Bm25Text: what Milvus' BM25 function indexes in schema-2 collections (the analysed context header
and text) and the query it is searched with."""

from __future__ import annotations

import re

from ragrpc.analyzer import EnglishAnalyzer
from ragrpc.models import ChunkRecord
from ragrpc.store import schema as s
from ragrpc.store.bm25_text import Bm25Text


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
        metadata={"organization": "Acme Corp", "fiscal_period": "FY2017"},
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
