"""A collection larger than the store's page size, on the in-memory fakes (regular suite) and on a
real milvus-lite server: every document is listed, found by sparse and dense search by a freshly
started query service, recovered after an interrupted attempt, and a document with more chunks than
one page is updated and deleted whole. (The large real run is in tests/reliability.)"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from ingest_service.app import build_components as build_ingest
from ingest_service.chunk_records import new_generation
from ingest_service.requests import DocumentSpecInput, IngestItem
from query_service.app import build_components as build_query
from query_service.retrieval_types import RetrievalQuery
from ragrpc.config import Settings
from ragrpc.models import ChunkKind, ChunkRecord, DocumentState
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.store.factory import open_milvus_stores
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry, all_records

PAGE = 5
DOCUMENTS = 4 * PAGE + 3
LONG_TEXT = " ".join(f"Paragraph {i} of the long manual explains the gearbox part number {i}." for i in range(60))


@dataclasses.dataclass
class World:
    settings: Settings
    embedder: HashingEmbedder
    chunks: Any
    registry: Any


@pytest.fixture(
    params=[
        "memory",
        "memory, dense in process",
        pytest.param("milvus-lite", marks=pytest.mark.slow),
        pytest.param("milvus-lite, scans by key", marks=pytest.mark.slow),
    ]
)
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    """milvus-lite scans this small collection with an iterator, as a Milvus server does; "scans by
    key" reads keys, then rows, as milvus-lite's scans of a large collection do (ragrpc.store.paging)."""
    embedder = HashingEmbedder(dimension=256)
    base = dataclasses.replace(
        Settings(), workers=2, store_page_size=PAGE, sparse_backend="rank_bm25", chunk_size_tokens=40
    )
    if request.param.startswith("memory"):
        if request.param.endswith("in process"):
            base = dataclasses.replace(base, dense_search="in_process")
        yield World(base, embedder, InMemoryChunkStore(page_size=PAGE), InMemoryDocumentRegistry(page_size=PAGE))
        return
    milvus_settings: Settings = request.getfixturevalue("milvus_settings")
    settings = dataclasses.replace(
        base, milvus_uri=milvus_settings.milvus_uri, collection_prefix=milvus_settings.collection_prefix
    )
    stores = open_milvus_stores(settings, model_id=embedder.model_id, dimension=embedder.dimension, writer=True)
    if request.param.endswith("by key"):
        stores.chunks.key_scan_from_rows = stores.registry.key_scan_from_rows = 0
    yield World(settings, embedder, stores.chunks, stores.registry)


def _word(i: int) -> str:
    return f"quokka{i:02d}zeta"


async def _ingest_all(world: World) -> Any:
    ingest = build_ingest(world.settings, world.embedder, world.chunks, world.registry)
    for i in range(DOCUMENTS):
        text = f"Note {i} is about the animal called {_word(i)} and nothing else."
        spec = DocumentSpecInput(document_id=f"doc-{i:02d}", file_name=f"doc-{i:02d}.txt")
        outcome = await ingest.pipeline.ingest(IngestItem("t1", spec, text.encode()))
        assert outcome.record.state == DocumentState.ACTIVE
    spec = DocumentSpecInput(
        document_id="manual", file_name="manual.txt", tags=["v1"], chunking_strategy="fixed_tokens"
    )
    await ingest.pipeline.ingest(IngestItem("t1", spec, LONG_TEXT.encode()))
    return ingest


def _chunks_of(world: World, document_id: str) -> list[ChunkRecord]:
    expr = f.and_(f.eq(s.TENANT, "t1"), f.eq(s.DOCUMENT_ID, document_id))
    return [c for page in world.chunks.scan_chunks(expr) for c in page]


async def test_more_documents_and_chunks_than_a_page(world: World) -> None:
    ingest = await _ingest_all(world)
    manual = world.registry.get("t1", "manual")
    assert manual.chunk_count > 2 * PAGE and len(_chunks_of(world, "manual")) == manual.chunk_count

    listed, token = [], ""
    while True:
        page = ingest.documents.list_page("t1", page_size=PAGE - 1, page_token=token)
        listed += [d.document_id for d in page.documents]
        token = page.next_page_token
        if not token:
            break
    assert listed == sorted([f"doc-{i:02d}" for i in range(DOCUMENTS)] + ["manual"])

    query = build_query(world.settings, world.embedder, world.chunks, world.registry)  # a fresh start
    assert query.follower.document_count == DOCUMENTS + 1
    # milvus-lite: the query service searches the vectors it holds (RAGRPC_DENSE_SEARCH=auto), loaded in pages
    in_memory_default = world.settings.dense_search == "auto" and isinstance(world.chunks, InMemoryChunkStore)
    expected = "store" if in_memory_default else "in_process"
    assert query.retrieval._dense.name == expected  # type: ignore[attr-defined]
    for i in range(DOCUMENTS):
        sparse = await query.retrieval.retrieve(RetrievalQuery(text=_word(i), tenant="t1", mode="sparse", top_k=1))
        assert [h.chunk.document_id for h in sparse.hits] == [f"doc-{i:02d}"], i
        # (hashed word vectors can collide, so the dense check asks for the top 3)
        dense = await query.retrieval.retrieve(RetrievalQuery(text=_word(i), tenant="t1", mode="dense", top_k=3))
        assert f"doc-{i:02d}" in [h.chunk.document_id for h in dense.hits], i

    await ingest.documents.update("t1", "manual", fields=["tags"], tags=["v2"])
    assert all(c.tags == ("v2",) for c in _chunks_of(world, "manual"))
    assert len(_chunks_of(world, "manual")) == manual.chunk_count
    query.follower.poll()
    tagged = await query.retrieval.retrieve(RetrievalQuery(text="gearbox", tenant="t1", mode="sparse", tags=["v2"]))
    assert {h.chunk.document_id for h in tagged.hits} == {"manual"}

    assert await ingest.documents.delete("t1", "manual") == manual.chunk_count
    assert _chunks_of(world, "manual") == [] and world.registry.get("t1", "manual") is None
    query.follower.poll()
    gone = await query.retrieval.retrieve(RetrievalQuery(text="gearbox", tenant="t1", mode="sparse"))
    assert gone.hits == []
    dense_gone = await query.retrieval.retrieve(RetrievalQuery(text="gearbox", tenant="t1", mode="dense", top_k=50))
    assert "manual" not in {h.chunk.document_id for h in dense_gone.hits}
    ingest.shutdown()
    query.executor.shutdown(wait=False)


async def test_recovery_rolls_back_more_interrupted_attempts_than_a_page(world: World) -> None:
    ingest = await _ingest_all(world)
    interrupted = [f"doc-{i:02d}" for i in range(0, DOCUMENTS, 2)]
    assert len(interrupted) > 2 * PAGE
    for document_id in interrupted:  # what a kill -9 in the middle of a replacement leaves
        record = world.registry.get("t1", document_id)
        record.pending_generation, record.state = new_generation(), DocumentState.PROCESSING
        world.registry.put(record)
        leftover = dataclasses.replace(
            _chunks_of(world, document_id)[0],
            chunk_id=f"pending-{document_id}",
            generation=record.pending_generation,
            vector=world.embedder.embed_documents(["leftover"])[0].tolist(),
            kind=ChunkKind.RETRIEVABLE,
        )
        world.chunks.insert_chunks([leftover])
    counts = ingest.lifecycle.recover()
    assert counts["attempts_rolled_back"] == len(interrupted)
    records = all_records(world.registry)
    assert {r.state for r in records} == {DocumentState.ACTIVE} and not any(r.pending_generation for r in records)
    for document_id in interrupted:
        current = world.registry.get("t1", document_id).generation
        assert [c.generation for c in _chunks_of(world, document_id)] == [current]
    ingest.shutdown()
