"""The query service's rank_bm25 index follows the shared store: new documents, replacements,
deletes, and UpdateDocument's new title/tags/metadata on chunks of the same generation."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

import pytest

from ingest_service.app import build_components as build_ingest
from ingest_service.requests import DocumentSpecInput, IngestItem
from query_service.dense_index import InProcessDenseIndex
from query_service.index_sync import ChunkIndexSync, indexed_chunk
from query_service.registry_follower import RegistryFollower
from query_service.sparse import RankBm25Retriever
from query_service.sparse_index import InProcessBm25Index
from ragrpc.analyzer import EnglishAnalyzer
from ragrpc.config import Settings
from ragrpc.models import ChunkKind, ChunkRecord
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.store.request_filter import filter_from_request
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry

DUCKS = b"Ducks swim on ponds and eat water plants. Mallards are the most common ducks."
SWANS = b"Swans are the largest waterfowl; mute swans live on lakes."


async def test_index_follows_ingest_replace_update_and_delete() -> None:
    chunks, registry = InMemoryChunkStore(), InMemoryDocumentRegistry()
    settings = dataclasses.replace(Settings(), workers=2)
    ingest = build_ingest(settings, HashingEmbedder(), chunks, registry)
    follower = RegistryFollower(registry)
    sync = ChunkIndexSync(InProcessBm25Index(EnglishAnalyzer()), chunks)
    follower.add_listener(sync)
    retriever = RankBm25Retriever(sync.index)
    follower.load()

    def hits(query: str, **filters) -> list[str]:  # type: ignore[no-untyped-def]
        follower.poll()  # what the query service's background task does every interval
        return [h.chunk.document_id for h in retriever.search(query, "t1", filter_from_request("t1", **filters), 10)]

    spec = DocumentSpecInput(document_id="birds", file_name="birds.txt", tags=["ducks"])
    await ingest.pipeline.ingest(IngestItem("t1", spec, DUCKS))
    assert hits("mallard ducks") == ["birds"] and hits("mallard ducks", tags=["ducks"]) == ["birds"]

    await ingest.documents.update("t1", "birds", fields=["tags"], tags=["waterfowl"])
    assert hits("mallard ducks", tags=["ducks"]) == []  # the old tag is gone from the index too
    assert hits("mallard ducks", tags=["waterfowl"]) == ["birds"]

    await ingest.pipeline.ingest(IngestItem("t1", dataclasses.replace(spec, tags=["waterfowl"]), SWANS))
    assert hits("mallard") == [] and hits("mute swans") == ["birds"]

    await ingest.documents.delete("t1", "birds")
    assert hits("mute swans") == []
    restarted = ChunkIndexSync(InProcessBm25Index(EnglishAnalyzer()), chunks)  # a query service started now
    again = RegistryFollower(registry)
    again.add_listener(restarted)
    await ingest.pipeline.ingest(IngestItem("t1", dataclasses.replace(spec, document_id="geese"), DUCKS))
    again.load()
    assert restarted.loaded_chunks == chunks.count_chunks(f.eq(s.DOCUMENT_ID, "geese")) >= 1  # what the log reports


def test_the_index_keeps_what_filters_and_hits_need_and_no_text() -> None:
    chunk = ChunkRecord(
        chunk_id="d1-0",
        document_id="d1",
        tenant="t1",
        collection="default",
        generation="g1",
        text="Net sales increased by 12 percent.",
        vector=[0.1, 0.2],
        chunk_index=0,
        chunker="auto/whole",
        title="Acme 10-K",
        tags=("finance",),
        metadata={"organization": "Acme Corp", "beir_id": "7", "title_source": "request"},
    )
    indexed = indexed_chunk(chunk, context_headers=True)
    assert indexed.text.endswith("Net sales increased by 12 percent.")
    assert s.TEXT not in indexed.attrs and s.DENSE not in indexed.attrs and s.TITLE not in indexed.attrs
    assert set(s.FILTERABLE_FIELDS) <= set(indexed.attrs)
    assert indexed.attrs["meta_organization"] == "Acme Corp" and s.METADATA not in indexed.attrs  # plain attributes
    other = indexed_chunk(dataclasses.replace(chunk, chunk_id="d1-1", document_id="".join(["d", "1"])))
    assert other.attrs[s.DOCUMENT_ID] is indexed.attrs[s.DOCUMENT_ID]  # one copy per document


async def test_the_dense_index_follows_ingest_replace_and_delete_and_retrieve_reads_the_rows() -> None:
    from query_service.app import build_components as build_query
    from query_service.retrieval_types import RetrievalQuery

    embedder = HashingEmbedder()
    chunks, registry = InMemoryChunkStore(), InMemoryDocumentRegistry()
    settings = dataclasses.replace(Settings(), workers=2, dense_search="in_process", sparse_backend="none")
    ingest = build_ingest(settings, embedder, chunks, registry)
    spec = DocumentSpecInput(document_id="birds", file_name="birds.txt", tags=["ducks"])
    await ingest.pipeline.ingest(IngestItem("t1", spec, DUCKS))
    query = build_query(settings, embedder, chunks, registry)  # loads: the vectors are read once
    store = build_query(dataclasses.replace(settings, dense_search="store"), embedder, chunks, registry)

    async def dense(engine, text: str, **filters) -> list[tuple[str, str, float]]:  # type: ignore[no-untyped-def]
        engine.follower.poll()
        result = await engine.retrieval.retrieve(RetrievalQuery(text=text, tenant="t1", mode="dense", **filters))
        return [(h.chunk.document_id, h.chunk.text, round(h.score, 5)) for h in result.hits]

    found = await dense(query, "mallard ducks")
    assert found and found[0][0] == "birds" and "Mallards" in found[0][1]  # the row read for the hit
    assert found == await dense(store, "mallard ducks")  # the same hits and scores as the store's search
    assert await dense(query, "mallard ducks", tags=["swans"]) == []
    await ingest.pipeline.ingest(IngestItem("t1", spec, SWANS))
    assert [d for d, text, _ in await dense(query, "mute swans") if "swans" in text] == ["birds"]
    assert all("Mallards" not in text for _, text, _ in await dense(query, "mallard ducks"))  # the old version left
    await ingest.documents.delete("t1", "birds")
    assert await dense(query, "mute swans") == []
    for engine in (query, store):
        engine.executor.shutdown(wait=False)
    ingest.shutdown()


def test_an_unknown_dense_search_is_refused() -> None:
    import pytest

    from query_service.dense import dense_search_mode
    from ragrpc import errors

    assert dense_search_mode("auto", InMemoryChunkStore()) == "store"  # the fake is not embedded
    assert dense_search_mode(" In_Process ", InMemoryChunkStore()) == "in_process"
    with pytest.raises(errors.PreconditionError, match="RAGRPC_DENSE_SEARCH"):
        dense_search_mode("faiss", InMemoryChunkStore())
    with pytest.raises(errors.PreconditionError, match="RAGRPC_DENSE_IN_PROCESS_MAX_CHUNKS"):
        dense_search_mode("auto", InMemoryChunkStore(), -1)


class _ServerLikeStore(InMemoryChunkStore):
    """The in-memory store standing in for a Milvus server, whose dense search is a round trip to an
    approximate index (the in-memory store's own is exact numpy in this process)."""

    @property
    def searches_exactly_in_process(self) -> bool:
        return False


async def test_auto_holds_the_vectors_of_a_small_server_collection_only() -> None:
    from query_service.app import build_components as build_query
    from query_service.dense import dense_search_mode

    embedder = HashingEmbedder()
    chunks, registry = _ServerLikeStore(), InMemoryDocumentRegistry()
    settings = dataclasses.replace(Settings(), workers=2, sparse_backend="none")
    ingest = build_ingest(settings, embedder, chunks, registry)
    for name, text in (("ducks", DUCKS), ("swans", SWANS)):
        spec = DocumentSpecInput(document_id=name, file_name=f"{name}.txt")
        await ingest.pipeline.ingest(IngestItem("t1", spec, text))
    count = chunks.count_chunks(f.gte(s.CHUNK_INDEX, 0))
    assert count >= 2
    assert dense_search_mode("auto", chunks, count) == "in_process"
    assert dense_search_mode("auto", chunks, count - 1) == "store"
    assert dense_search_mode("auto", chunks, 0) == "store"  # 0: never held
    assert dense_search_mode("store", chunks, count) == "store"  # only auto decides by size
    assert dense_search_mode("auto", InMemoryChunkStore(), count) == "store"  # exact in process already
    held, above = (
        build_query(dataclasses.replace(settings, dense_in_process_max_chunks=limit), embedder, chunks, registry)
        for limit in (count, count - 1)
    )
    assert held.retrieval._dense.name == "in_process" and above.retrieval._dense.name == "store"
    for engine in (held, above):
        engine.executor.shutdown(wait=False)
    ingest.shutdown()


class _CountingAnalyzer(EnglishAnalyzer):
    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def analyze(self, text: str) -> list[str]:
        self.texts.append(text)
        return super().analyze(text)


async def test_stored_terms_are_loaded_without_analysing_the_chunks_again_and_score_the_same() -> None:
    """A store that keeps each chunk's analysed terms (chunks schema 2) saves the index from analysing
    every chunk at start and on each reload; what it finds, and the scores, are those of analysing."""
    from ragrpc.store.bm25_text import Bm25Text

    settings = dataclasses.replace(Settings(), workers=2, chunk_size_tokens=20, chunk_overlap_tokens=0)
    results = {}
    for keeps_terms in (False, True):
        store = InMemoryChunkStore(bm25_text=Bm25Text(EnglishAnalyzer()) if keeps_terms else None)
        registry = InMemoryDocumentRegistry()
        ingest = build_ingest(settings, HashingEmbedder(), store, registry)
        for name, text in (("birds", DUCKS), ("swans", SWANS)):
            spec = DocumentSpecInput(document_id=name, file_name=f"{name}.txt", title=f"Field guide: {name}")
            await ingest.pipeline.ingest(IngestItem("t1", spec, text * 4))
        analyzer = _CountingAnalyzer()
        follower = RegistryFollower(registry)
        sync = ChunkIndexSync(InProcessBm25Index(analyzer), store, context_headers=True)
        follower.add_listener(sync)
        follower.load()
        spec = DocumentSpecInput(document_id="geese", file_name="geese.txt", title="Field guide: geese")
        await ingest.pipeline.ingest(IngestItem("t1", spec, b"Geese graze on fields and fly in skeins."))
        follower.poll()  # a reload after start
        retriever = RankBm25Retriever(sync.index)
        found = retriever.search("field guide swans mallards geese", "t1", filter_from_request("t1"), 10)
        results[keeps_terms] = [  # chunk ids name the generation, which differs between the runs
            (h.chunk.document_id, h.chunk.chunk_index, round(h.scores.sparse or 0.0, 9)) for h in found
        ]
        indexed_texts = [t for t in analyzer.texts if t != "field guide swans mallards geese"]
        assert sync.loaded_chunks > 2
        assert (indexed_texts == []) if keeps_terms else len(indexed_texts) > sync.loaded_chunks
        ingest.shutdown()
    assert results[True] == results[False]
    assert {document for document, _, _ in results[True]} == {"birds", "swans", "geese"}


class _ObservedScanStore(InMemoryChunkStore):
    """Pages of one chunk; after each page the test's `observe` sees the index as the scan left it."""

    observe: Callable[[], None] = staticmethod(lambda: None)

    def scan_chunks(self, expr, batch_size=None, **options):  # type: ignore[no-untyped-def]
        for page in super().scan_chunks(expr, batch_size=1, **options):
            yield page
            self.observe()


async def test_the_start_up_load_indexes_each_document_once_the_scan_has_all_its_chunks() -> None:
    """Documents complete one after another during the scan (its memory is the partial documents, not
    the collection); a document the store returns short of, or beyond, its registry count is not
    indexed at start and is left to the follower to read again."""
    store, registry = _ObservedScanStore(), InMemoryDocumentRegistry()
    settings = dataclasses.replace(Settings(), workers=2, chunk_size_tokens=20, chunk_overlap_tokens=0)
    ingest = build_ingest(settings, HashingEmbedder(), store, registry)
    for name in ("a", "b", "c", "short", "long"):
        spec = DocumentSpecInput(document_id=name, file_name=f"{name}.txt")
        await ingest.pipeline.ingest(IngestItem("t1", spec, (DUCKS + b" " + SWANS + b" ") * 4 + name.encode()))
    ingest.shutdown()
    retrievable = f.eq(s.KIND, int(ChunkKind.RETRIEVABLE))
    per_document = {
        name: sorted(
            c.chunk_id
            for page in store.scan_chunks(f.eq(s.DOCUMENT_ID, name))
            for c in page
            if c.kind == ChunkKind.RETRIEVABLE
        )
        for name in ("a", "b", "c", "short", "long")
    }
    assert all(len(ids) >= 2 for ids in per_document.values())  # several chunks each, interleaved by id
    store.delete_chunks(f.eq(s.CHUNK_ID, per_document["short"][0]))
    extra = copy.deepcopy(
        next(
            c
            for page in store.scan_chunks(f.eq(s.DOCUMENT_ID, "long"), with_vectors=True)
            for c in page
            if c.kind == ChunkKind.RETRIEVABLE
        )
    )
    extra.chunk_id, extra.chunk_index = extra.chunk_id + "-extra", 999
    store.insert_chunks([extra])

    follower = RegistryFollower(registry)
    sync = ChunkIndexSync(
        InProcessBm25Index(EnglishAnalyzer()), store, dense=InProcessDenseIndex(HashingEmbedder().dimension)
    )
    follower.add_listener(sync)
    during: list[int] = []
    total = sum(1 for page in store.scan_chunks(retrievable) for _ in page)
    store.observe = lambda: during.append(sync.index.document_count("t1"))
    follower.load()
    assert len(during) == total and during[0] == 0
    assert during[-2] >= 3  # before the last page, all but the one it completes were indexed already
    assert sorted(sync.documents()) == ["t1/a", "t1/b", "t1/c"]  # "short" and "long": read again later
    assert sync.loaded_chunks == sum(len(per_document[name]) for name in ("a", "b", "c"))
    assert sync.index.document_count("t1") == 3 and sync.dense.chunk_count("t1") == sync.loaded_chunks
    follower.poll()  # the follower reads the two again: "long" whole, "short" still short (kept out)
    assert sorted(sync.documents()) == ["t1/a", "t1/b", "t1/c", "t1/long"]
    # read by the ids its chunk span derives: the stray row, another id, is not one of its chunks
    assert sync.documents()["t1/long"][1] == len(per_document["long"])


async def test_changed_documents_are_read_by_their_derived_ids_and_records_without_a_span_by_generation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A change's chunks are read by the ids its generation and chunk span derive (a key lookup, where
    a filter on the generation scans the collection): a hierarchical document's (parents within the
    span, not indexed), a metadata update's copies under a new generation (a store whose upsert
    leaves its partition). A record without a span (written before spans were) is read by generation."""
    from query_service import index_sync
    from ragrpc.testing.faults import FaultPlan, FaultyChunkStore

    monkeypatch.setattr(index_sync, "_KEY_READ_BATCH", 3)  # every change's ids past one read
    inner, registry = InMemoryChunkStore(upsert_keeps_partitions=False), InMemoryDocumentRegistry()
    reads = FaultyChunkStore(inner, FaultPlan.counting())
    settings = dataclasses.replace(Settings(), workers=2, chunk_size_tokens=20, chunk_overlap_tokens=0)
    ingest = build_ingest(settings, HashingEmbedder(), inner, registry)
    follower = RegistryFollower(registry)
    sync = ChunkIndexSync(
        InProcessBm25Index(EnglishAnalyzer()), reads, dense=InProcessDenseIndex(HashingEmbedder().dimension)
    )
    follower.add_listener(sync)
    follower.load()

    text = (DUCKS + b"\n\n" + SWANS + b"\n\n") * 6
    tree = DocumentSpecInput(document_id="tree", file_name="tree.txt", chunking_strategy="hierarchical")
    flat = DocumentSpecInput(document_id="flat", file_name="flat.txt", tags=["ducks"])
    await ingest.pipeline.ingest(IngestItem("t1", tree, text))
    await ingest.pipeline.ingest(IngestItem("t1", flat, text))
    first = registry.get("t1", "flat").generation
    await ingest.documents.update("t1", "flat", fields=["tags"], tags=["waterfowl"])  # copies, a new generation
    records = registry.get_many(["t1/tree", "t1/flat"])
    assert records["t1/flat"].generation != first
    parents = [
        c
        for page in inner.scan_chunks(f.eq(s.GENERATION, records["t1/tree"].generation))
        for c in page
        if c.kind == ChunkKind.PARENT
    ]
    assert parents and records["t1/tree"].chunk_span > records["t1/tree"].chunk_count
    reads.plan = FaultPlan.counting()
    follower.poll()
    assert set(reads.plan.calls) == {"chunks.get_chunks"}, "read by key, never by a generation scan"
    for key, record in records.items():
        assert sync.documents()[key] == (record.generation, record.chunk_count)
    assert sync.index.document_count("t1") == 2 and sync.dense.chunk_count("t1") == sum(
        r.chunk_count for r in records.values()
    )
    assert {c.generation for c in inner.get_chunks([h for h, _ in sync.index.search("mallards", 50, tenant="t1")])} <= {
        r.generation for r in records.values()
    }

    old = DocumentSpecInput(document_id="old", file_name="old.txt")
    await ingest.pipeline.ingest(IngestItem("t1", old, SWANS))
    record = registry.get("t1", "old")
    record.chunk_span = 0  # as a record written before spans were
    registry.put(record)
    reads.plan = FaultPlan.counting()
    follower.poll()
    assert "chunks.scan_chunks" in reads.plan.calls
    assert sync.documents()["t1/old"] == (record.generation, record.chunk_count)
    ingest.shutdown()
