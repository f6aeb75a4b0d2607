"""Chunks that know their document: the context header (title, section path) is embedded with
every chunk and indexed for BM25, cut to its token budget, while Chunk.text stays the chunk's own
text; a passage is then found by the name of its document, and look-alike passages of two
documents are told apart."""

from __future__ import annotations

import dataclasses

import numpy as np

from ingest_service.app import build_components
from ingest_service.requests import DocumentSpecInput, IngestItem
from query_service.app import build_components as build_query
from query_service.app import load_follower
from query_service.retrieval_types import RetrievalQuery
from ragrpc.config import Settings
from ragrpc.context_header import (
    MAX_HEADER_TOKENS,
    context_header,
    cut_to_tokens,
    embedded_text,
    header_budget,
    with_header,
)
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry


class RecordingEmbedder(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__(dimension=64)
        self.texts: list[str] = []

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        self.texts.extend(texts)
        return super().embed_documents(texts)


def test_the_header_names_title_and_sections_and_skips_a_repeated_title() -> None:
    assert context_header("Annual Report 2017", ("Item 7", "Results")) == "Annual Report 2017 | Item 7 > Results"
    assert context_header("Guide", ("guide", "Setup")) == "Guide | Setup"
    assert context_header("", ("Setup",)) == "Setup"
    assert context_header("  Spaced   title ", ()) == "Spaced title"
    assert with_header("", "body") == "body" and with_header("H", "body") == "H\nbody"


def test_the_header_terms_of_the_metadata_follow_the_title() -> None:
    terms = {"header_terms": "Advanced Micro Devices, Inc. (AMD)  10-K FY2022"}  # an enricher's, or the request's
    assert context_header("Annual Report", ("Item 8",), terms) == (
        "Annual Report | Advanced Micro Devices, Inc. (AMD) 10-K FY2022 | Item 8"
    )
    assert context_header("", ("Item 8",), terms) == "Advanced Micro Devices, Inc. (AMD) 10-K FY2022 | Item 8"
    # other metadata, of any key, is not in the header
    assert context_header("Guide", (), {"organization": "Acme Corp", "tags": "x"}) == "Guide"
    assert context_header("Guide", (), {"header_terms": "  "}) == "Guide"


def test_a_long_header_is_cut_at_a_word_to_its_token_budget() -> None:
    counter = HashingEmbedder().token_counter()
    header = context_header("A very long title " * 20, ("Section one", "Section two"))
    cut = cut_to_tokens(header, counter)
    assert counter.count(cut) <= MAX_HEADER_TOKENS < counter.count(header)
    assert header.startswith(cut) and not cut.endswith(" ")


def _settings(**changes: object) -> Settings:
    values: dict[str, object] = {"workers": 2, "chunk_size_tokens": 40, "chunk_overlap_tokens": 0, **changes}
    return dataclasses.replace(Settings(), **values)  # type: ignore[arg-type]


SAME_TABLE = "Net sales increased by 12 percent compared with the prior year. Operating income rose as well."


async def test_the_header_is_embedded_but_not_returned_and_bm25_finds_the_document_by_its_title() -> None:
    embedder = RecordingEmbedder()
    chunks, registry = InMemoryChunkStore(), InMemoryDocumentRegistry()
    settings = _settings(sparse_backend="rank_bm25")
    ingest = build_components(settings, embedder, chunks, registry)
    titles = (("acme-2017", "Acme Corporation Annual Report 2017"), ("zenith-2018", "Zenith Ltd 2018"))
    for document_id, title in titles:
        spec = DocumentSpecInput(document_id=document_id, file_name=f"{document_id}.md", title=title)
        text = f"# Results of Operations\n\n{SAME_TABLE}\n"
        await ingest.pipeline.ingest(IngestItem("t1", spec, text.encode()))
    assert any(t.startswith("Acme Corporation Annual Report 2017 | Results of Operations\n") for t in embedder.texts)
    stored = [c for page in chunks.scan_chunks(f.eq(s.DOCUMENT_ID, "acme-2017")) for c in page]
    assert stored and all(not c.text.startswith("Acme Corporation") for c in stored)  # Chunk.text: its own text

    query = build_query(settings, embedder, chunks, registry)
    load_follower(query.follower)
    result = await query.retrieval.retrieve(
        RetrievalQuery(text="Acme net sales increased", tenant="t1", mode="sparse", top_k=2)
    )
    assert result.hits[0].chunk.document_id == "acme-2017"  # the same passage, told apart by its document
    assert not result.hits[0].chunk.text.startswith("Acme")
    query.executor.shutdown(wait=False)
    ingest.shutdown()


async def test_what_was_embedded_can_be_rebuilt_from_the_stored_chunk() -> None:
    """The ingestion benchmark compares the service with the model embedding the same texts, rebuilt
    from the stored chunks (title, section path, metadata with the enrichers' header terms, text)."""
    embedder = RecordingEmbedder()
    chunks = InMemoryChunkStore()
    settings = _settings(chunk_size_tokens=30, enrichers="filings")
    ingest = build_components(settings, embedder, chunks, InMemoryDocumentRegistry())
    spec = DocumentSpecInput(
        document_id="acme-q3", file_name="acme-q3.md", title="0001018724-18-000005", metadata={"team": "ir"}
    )
    body = "Acme Corporation\nForm 10-Q\nFor the quarterly period ended September 30, 2018\n\n"
    body += "# Results\n\n" + " ".join(f"Revenue line {i} grew." for i in range(40)) + "\n"
    await ingest.pipeline.ingest(IngestItem("t1", spec, body.encode()))
    stored = sorted(
        (c for page in chunks.scan_chunks(f.eq(s.DOCUMENT_ID, "acme-q3")) for c in page), key=lambda c: c.chunk_index
    )
    counter, window = embedder.token_counter(), embedder.max_tokens
    rebuilt = [embedded_text(c.title, c.section_path, c.metadata, c.text, counter, window) for c in stored]
    assert len(stored) > 2 and rebuilt == embedder.texts
    assert any(text != c.text for text, c in zip(rebuilt, stored, strict=True))  # headers were added
    assert all(c.metadata["header_terms"] == "Acme Corporation 10-Q 2018-Q3" for c in stored)
    assert all("Acme Corporation 10-Q 2018-Q3" in text.split("\n", 1)[0] for text in rebuilt)
    ingest.shutdown()


async def test_headers_can_be_switched_off() -> None:
    embedder = RecordingEmbedder()
    ingest = build_components(
        _settings(context_headers=False), embedder, InMemoryChunkStore(), InMemoryDocumentRegistry()
    )
    spec = DocumentSpecInput(document_id="plain", file_name="plain.txt", title="Plain Title")
    await ingest.pipeline.ingest(IngestItem("t1", spec, SAME_TABLE.encode()))
    assert embedder.texts and all(not t.startswith("Plain Title") for t in embedder.texts)
    ingest.shutdown()


def test_the_planner_plans_with_the_whole_window_and_the_header_gets_what_a_chunk_leaves_free() -> None:
    embedder = HashingEmbedder(max_tokens=100)
    on = build_components(_settings(chunk_size_tokens=100), embedder, InMemoryChunkStore(), InMemoryDocumentRegistry())
    off = build_components(
        _settings(chunk_size_tokens=100, context_headers=False),
        embedder,
        InMemoryChunkStore(),
        InMemoryDocumentRegistry(),
    )
    # adding headers never splits a passage that was one chunk without them
    assert on.pipeline._planner._base.max_tokens == 100  # type: ignore[attr-defined]
    assert off.pipeline._planner._base.max_tokens == 100  # type: ignore[attr-defined]
    on.shutdown()
    off.shutdown()
    counter = embedder.token_counter()
    assert header_budget("word " * 10, counter, 100) == MAX_HEADER_TOKENS
    assert header_budget("word " * 80, counter, 100) == 100 - 80 - 1
    assert header_budget("word " * 99, counter, 100) == 0
    assert cut_to_tokens("A title | Section", counter, 0) == ""


class CountingCounter:
    def __init__(self) -> None:
        self.counted: list[str] = []

    def count(self, text: str) -> int:
        self.counted.append(text)
        return len(text.split())

    def spans(self, text: str) -> list[tuple[int, int]]:
        raise AssertionError("not used")


def test_a_chunk_whose_token_bound_leaves_the_whole_header_free_is_not_counted_again() -> None:
    counter = CountingCounter()
    text = "word " * 60
    assert header_budget(text, counter, 100, text_tokens_at_most=67) == MAX_HEADER_TOKENS
    assert counter.counted == []
    # a bound that could leave less than the whole header: the text is counted, the budget is exact
    assert header_budget(text, counter, 100, text_tokens_at_most=80) == MAX_HEADER_TOKENS
    assert header_budget("word " * 80, counter, 100, text_tokens_at_most=85) == 100 - 80 - 1
    assert len(counter.counted) == 2
    with_bound = embedded_text("Title", ("Part",), {}, text, counter, 100, 67)
    assert with_bound == embedded_text("Title", ("Part",), {}, text, CountingCounter(), 100)


async def test_a_chunk_that_fills_the_window_is_embedded_within_it() -> None:
    embedder = RecordingEmbedder()
    embedder_window = embedder.max_tokens
    ingest = build_components(
        _settings(chunk_size_tokens=embedder_window), embedder, InMemoryChunkStore(), InMemoryDocumentRegistry()
    )
    body = " ".join(f"w{i}" for i in range(embedder_window - 3))  # one paragraph, nearly the window
    spec = DocumentSpecInput(document_id="full", file_name="full.txt", title="A Title Of Several Words Here")
    await ingest.pipeline.ingest(IngestItem("t1", spec, body.encode()))
    counter = embedder.token_counter()
    assert embedder.texts and all(counter.count(t) <= embedder_window for t in embedder.texts)
    assert any(t.startswith("A Title") for t in embedder.texts)  # the 2 free tokens take what fits
    ingest.shutdown()


def test_a_chunk_that_begins_with_the_title_gets_no_second_copy() -> None:
    assert context_header("Alpha Report", ("Results",), None, "Alpha  report\n\nThe body") == "Results"
    assert context_header("Alpha Report", (), None, "Alpha report\nbody") == ""
    assert context_header("Alpha Report", (), None, "The body mentions Alpha Report") == "Alpha Report"
    assert context_header("Acme Corp 10-K", (), {"header_terms": "FY2017"}, "Acme Corp 10-K\nItem 1") == "FY2017"
