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


class RecordingReranker:
    """Reverses the head it is given (so the fused rest matters) and records how many it saw."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def rerank(self, query: str, hits, top_n: int):  # type: ignore[no-untyped-def]
        self.seen.append(len(hits))
        return [dataclasses.replace(h, score=float(i)) for i, h in enumerate(hits)][::-1]


@pytest.fixture
async def many() -> tuple:  # type: ignore[type-arg]
    """40 documents that all match "ducks" (the fused ranking is longer than any head a query reads)."""
    chunks, registry, embedder = InMemoryChunkStore(), InMemoryDocumentRegistry(), HashingEmbedder()
    settings = dataclasses.replace(Settings(), workers=2, sparse_backend="rank_bm25", rerank_top_n=12)
    ingest = build_ingest(settings, embedder, chunks, registry)
    for i in range(40):
        await add(ingest, "a", f"d{i:02d}", f"Ducks number {i} paddle {'quietly ' * (i % 7)}on pond {i % 5}.")
    reranker = RecordingReranker()
    query = build_query(settings, embedder, chunks, registry, reranker=reranker)
    query.follower.poll()
    plain = build_query(settings, embedder, chunks, registry)
    plain.follower.poll()
    return query, reranker, plain


async def test_the_reranker_gets_its_whole_head_whatever_the_top_k(many) -> None:  # type: ignore[no-untyped-def]
    query, reranker, plain = many
    fused = await plain.retrieval.retrieve(q("ducks paddle pond", top_k=40))
    assert len(fused.hits) == 40
    result = await query.retrieval.retrieve(q("ducks paddle pond", top_k=3))
    assert reranker.seen == [12] and result.reranked
    # the reversed head of 12: the fused 12th first
    assert [h.chunk.chunk_id for h in result.hits] == [h.chunk.chunk_id for h in fused.hits[:12][::-1][:3]]
    wide = await query.retrieval.retrieve(q("ducks paddle pond", top_k=20))  # past the head: the fused rest
    assert [h.chunk.chunk_id for h in wide.hits[12:]] == [h.chunk.chunk_id for h in fused.hits[12:20]]


async def test_mmr_chooses_from_its_whole_pool_in_hybrid(many) -> None:  # type: ignore[no-untyped-def]
    _, _, plain = many
    fused = await plain.retrieval.retrieve(q("ducks paddle pond", top_k=40))
    diverse = await plain.retrieval.retrieve(q("ducks paddle pond", top_k=2, mmr_lambda=0.0))
    pool = {h.chunk.chunk_id for h in fused.hits[:20]}  # max(4 * top_k, 20)
    assert len(diverse.hits) == 2 and {h.chunk.chunk_id for h in diverse.hits} <= pool
    # lambda 0 is diversity alone: after the first, the pool's least similar to it, not the fused 2nd
    assert diverse.hits[1].chunk.chunk_id != fused.hits[1].chunk.chunk_id


async def test_a_minimum_score_filters_the_whole_ranking(many) -> None:  # type: ignore[no-untyped-def]
    _, _, plain = many
    fused = await plain.retrieval.retrieve(q("ducks paddle pond", top_k=40))
    threshold = fused.hits[5].score
    result = await plain.retrieval.retrieve(q("ducks paddle pond", top_k=3, min_score=threshold))
    assert [h.chunk.chunk_id for h in result.hits] == [h.chunk.chunk_id for h in fused.hits[:3]]
    everything = await plain.retrieval.retrieve(q("ducks paddle pond", top_k=40, min_score=fused.hits[-1].score))
    assert len(everything.hits) == 40
