"""The retrieval pipeline over the ingest pipeline's real output (fakes for model and store):
tenant isolation, filters, visibility of replaced documents, fusion modes, MMR, parents."""

from __future__ import annotations

import dataclasses

import pytest

from ingest_service.app import build_components as build_ingest
from ingest_service.requests import DocumentSpecInput, IngestItem
from query_service.app import build_components as build_query
from query_service.retrieval_types import RetrievalQuery
from ragrpc import errors
from ragrpc.config import Settings
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry


@pytest.fixture
def world(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    chunks, registry, embedder = InMemoryChunkStore(), InMemoryDocumentRegistry(), HashingEmbedder()
    # a test about the geometry of its own texts embeds them without context headers
    headers = request.node.get_closest_marker("without_context_headers") is None
    settings = dataclasses.replace(Settings(), workers=2, sparse_backend="rank_bm25", context_headers=headers)
    query = build_query(settings, embedder, chunks, registry)
    retrieve = query.retrieval.retrieve

    async def followed_retrieve(request: RetrievalQuery):  # type: ignore[no-untyped-def]
        query.follower.poll()  # what the service's background task does every RAGRPC_REGISTRY_FOLLOW_INTERVAL_S
        return await retrieve(request)

    query.retrieval.retrieve = followed_retrieve  # type: ignore[method-assign]
    return build_ingest(settings, embedder, chunks, registry), query


async def add(ingest, tenant: str, doc_id: str, text: str, **spec) -> None:  # type: ignore[no-untyped-def]
    await ingest.pipeline.ingest(
        IngestItem(tenant, DocumentSpecInput(document_id=doc_id, file_name=f"{doc_id}.txt", **spec), text.encode())
    )


def q(text: str, tenant: str = "a", **options) -> RetrievalQuery:  # type: ignore[no-untyped-def]
    return RetrievalQuery(text=text, tenant=tenant, **options)


async def test_tenants_never_see_each_other(world) -> None:  # type: ignore[no-untyped-def]
    ingest, query = world
    await add(ingest, "a", "duck-a", "Ducks paddle on the village pond every morning.")
    await add(ingest, "b", "duck-b", "Ducks paddle on the village pond every morning.")
    for mode in ("dense", "sparse", "hybrid"):
        result = await query.retrieval.retrieve(q("ducks pond", mode=mode, document_ids=["duck-b", "duck-a"]))
        assert {h.chunk.document_id for h in result.hits} == {"duck-a"}, mode
        assert all(h.chunk.tenant == "a" for h in result.hits)


async def test_filters_exclude_what_they_should(world) -> None:  # type: ignore[no-untyped-def]
    ingest, query = world
    await add(ingest, "a", "d1", "Ducks eat water plants.", tags=["birds"], source="wiki", collection="nature")
    await add(ingest, "a", "d2", "Ducks are popular in parks.", tags=["parks"], source="blog", collection="nature")
    await add(ingest, "a", "d3", "Ducks appear in cartoons.", source="blog", collection="media")
    cases = {
        "tags": ({"tags": ["birds"]}, {"d1"}),
        "sources": ({"sources": ["blog"]}, {"d2", "d3"}),
        "collection": ({"collection": "media"}, {"d3"}),
        "documents": ({"document_ids": ["d2"]}, {"d2"}),
        "media types": ({"media_types": ["application/pdf"]}, set()),
    }
    for name, (options, expected) in cases.items():
        for mode in ("dense", "sparse", "hybrid"):
            result = await query.retrieval.retrieve(q("ducks", mode=mode, **options))
            assert {h.chunk.document_id for h in result.hits} == expected, (name, mode)


async def test_replaced_document_is_never_doubled(world) -> None:  # type: ignore[no-untyped-def]
    ingest, query = world
    await add(ingest, "a", "doc", "Old text about geese and ganders.")
    await add(ingest, "a", "doc", "New text about swans and cygnets.")
    result = await query.retrieval.retrieve(q("geese swans", mode="hybrid"))
    assert [h.chunk.text for h in result.hits] == ["New text about swans and cygnets."]


async def test_fusion_reports_stage_scores(world) -> None:  # type: ignore[no-untyped-def]
    ingest, query = world
    await add(ingest, "a", "d1", "Mallards migrate south in winter.")
    await add(ingest, "a", "d2", "Teal ducks are small dabbling ducks.")
    rrf = await query.retrieval.retrieve(q("mallards migrate"))
    assert rrf.score_kind == "rrf" and rrf.hits[0].chunk.document_id == "d1"
    top = rrf.hits[0].scores
    assert top.dense is not None and top.sparse is not None and top.fused == rrf.hits[0].score
    weighted = await query.retrieval.retrieve(q("mallards migrate", fusion="weighted"))
    assert weighted.score_kind == "weighted" and 0.0 <= weighted.hits[0].score <= 1.0
    assert rrf.rerank_skipped_reason == "no reranker configured" and not rrf.reranked
    stages = [name for name, _ in rrf.timings]
    assert {"embed_query", "dense_search", "sparse_search", "fuse", "total"} <= set(stages)


@pytest.mark.without_context_headers
async def test_mmr_removes_near_duplicates(world) -> None:  # type: ignore[no-untyped-def]
    ingest, query = world
    text = "Ducks dabble for food in shallow water near the shore."
    for i in range(4):
        await add(ingest, "a", f"dup{i}", text + " " * i)  # same words: near-identical vectors
    await add(ingest, "a", "other", "Ducks also dive for food in deeper water.")
    plain = await query.retrieval.retrieve(q("ducks food water", mode="dense", top_k=2))
    assert {h.chunk.document_id for h in plain.hits} <= {f"dup{i}" for i in range(4)}
    diverse = await query.retrieval.retrieve(q("ducks food water", mode="dense", top_k=2, mmr_lambda=0.5))
    assert "other" in {h.chunk.document_id for h in diverse.hits}


async def test_sparse_mode_without_backend_is_refused() -> None:
    chunks, registry, embedder = InMemoryChunkStore(), InMemoryDocumentRegistry(), HashingEmbedder()
    settings = dataclasses.replace(Settings(), workers=1, sparse_backend="none")
    query = build_query(settings, embedder, chunks, registry)
    with pytest.raises(errors.PreconditionError):
        await query.retrieval.retrieve(q("ducks", mode="sparse"))


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
