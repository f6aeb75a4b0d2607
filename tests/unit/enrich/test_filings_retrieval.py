"""The filings enricher at query time, through the retrieval pipeline over the ingest pipeline's real
output (fakes for model and store): a question naming a period or a company its own way finds the filing
whose context headers name it."""

from __future__ import annotations

import dataclasses

import pytest

from ingest_service.app import build_components as build_ingest
from query_service.app import build_components as build_query
from query_service.retrieval_types import RetrievalQuery
from ragrpc.config import Settings
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry
from tests.unit.test_retrieval_pipeline import add, q


@pytest.fixture
def world():  # type: ignore[no-untyped-def]
    chunks, registry, embedder = InMemoryChunkStore(), InMemoryDocumentRegistry(), HashingEmbedder()
    settings = dataclasses.replace(Settings(), workers=2, sparse_backend="rank_bm25", enrichers="filings")
    query = build_query(settings, embedder, chunks, registry)
    retrieve = query.retrieval.retrieve

    async def followed_retrieve(request: RetrievalQuery):  # type: ignore[no-untyped-def]
        query.follower.poll()
        return await retrieve(request)

    query.retrieval.retrieve = followed_retrieve  # type: ignore[method-assign]
    return build_ingest(settings, embedder, chunks, registry), query


def _annual_report(year: int) -> str:
    return (
        "UNITED STATES SECURITIES AND EXCHANGE COMMISSION\n"
        "FORM 10-K\n"
        f"ANNUAL REPORT PURSUANT TO SECTION 13 OR 15(d) for the fiscal year ended December 31, {year}\n"
        "Acme Widgets, Inc.\n"
        "(Exact name of registrant as specified in its charter)\n\n"
        "Capital expenditures were spent on new widget presses and the warehouse roof.\n"
    )


async def test_a_question_naming_a_fiscal_year_its_own_way_finds_that_year_s_filing(world) -> None:  # type: ignore[no-untyped-def]
    """The two filings differ only in their period (in each chunk's context header); "FY17" and
    "fiscal 2018" are matched to the headers' "FY2017" / "FY2018" by the BM25 query."""
    ingest, query = world
    await add(ingest, "a", "acme-2017", _annual_report(2017))
    await add(ingest, "a", "acme-2018", _annual_report(2018))
    for i, topic in enumerate(("Ducks paddle on ponds.", "Geese fly south.", "Swans nest by lakes.", "Teal dabble.")):
        await add(ingest, "a", f"other-{i}", topic)  # rank_bm25's idf of a term in 1 of 2 documents is 0
    for question, expected in (
        ("Acme capital expenditures FY17", "acme-2017"),
        ("Acme capital expenditures in fiscal 2018", "acme-2018"),
    ):
        result = await query.retrieval.retrieve(q(question, mode="sparse", top_k=2))
        assert [h.chunk.document_id for h in result.hits][0] == expected, question
        assert result.hits[0].scores.sparse > result.hits[1].scores.sparse, question


def _annual_report_of(company: str, ticker: str) -> str:
    return (
        "UNITED STATES SECURITIES AND EXCHANGE COMMISSION\nFORM 10-K\n"
        "ANNUAL REPORT PURSUANT TO SECTION 13 OR 15(d) for the fiscal year ended December 31, 2022\n"
        f"{company}\n(Exact name of registrant as specified in its charter)\n"
        "Title of each class Trading Symbol(s) Name of each exchange on which registered\n"
        f"Common Stock, $0.01 par value {ticker} The Nasdaq Global Select Market\n\n"
        "Capital expenditures were spent on new fabrication tools and test equipment.\n"
    )


async def test_a_question_naming_a_company_by_its_ticker_finds_that_company_s_filing(world) -> None:  # type: ignore[no-untyped-def]
    """The two filings differ only in their company; the question names one by its ticker, which only
    the context header of each chunk carries (from the cover's securities table)."""
    ingest, query = world
    paragraphs = {"chunking_strategy": "paragraph", "chunk_size_tokens": 40}  # the cover and the text: 2 chunks
    await add(ingest, "a", "amd-2022", _annual_report_of("ADVANCED MICRO DEVICES, INC.", "AMD"), **paragraphs)
    await add(ingest, "a", "nvda-2022", _annual_report_of("NVIDIA CORPORATION", "NVDA"), **paragraphs)
    for i, topic in enumerate(("Ducks paddle on ponds.", "Geese fly south.", "Swans nest by lakes.", "Teal dabble.")):
        await add(ingest, "a", f"other-{i}", topic)
    result = await query.retrieval.retrieve(q("AMD capital expenditures", mode="sparse", top_k=2))
    assert [(h.chunk.document_id, h.chunk.text.split()[0]) for h in result.hits] == [
        ("amd-2022", "Capital"),  # the chunk that never names AMD, by its header
        ("nvda-2022", "Capital"),
    ]
    assert result.hits[0].scores.sparse > result.hits[1].scores.sparse
