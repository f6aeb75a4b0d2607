"""The Milvus adapters against a real milvus-lite server with the real bundled model."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from ragrpc import errors
from ragrpc.config import Settings
from ragrpc.embeddings import SentenceTransformerEmbedder
from ragrpc.models import ChunkRecord, DocumentRecord, DocumentState
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.store.factory import open_milvus_stores, read_own_registry_writes
from ragrpc.store.request_filter import filter_from_request
from ragrpc.testing import all_records

pytestmark = pytest.mark.slow


def _chunk(
    embedder: SentenceTransformerEmbedder,
    chunk_id: str,
    text: str,
    tenant: str = "t1",
    document_id: str = "d1",
    source: str = "a.txt",
    tags: tuple[str, ...] = (),
) -> ChunkRecord:
    return ChunkRecord(
        chunk_id=chunk_id,
        document_id=document_id,
        tenant=tenant,
        collection="default",
        generation="g1",
        text=text,
        vector=embedder.embed_documents([text])[0].tolist(),
        chunk_index=0,
        chunker="fixed_tokens",
        source=source,
        tags=tags,
    )


def test_schema_model_check_and_round_trip(milvus_settings: Settings, real_embedder) -> None:  # type: ignore[no-untyped-def]
    stores = open_milvus_stores(
        milvus_settings, model_id=real_embedder.model_id, dimension=real_embedder.dimension, writer=True
    )
    assert stores.setup.bm25_supported
    stores.chunks.insert_chunks(
        [
            _chunk(real_embedder, "c1", "Ducks swim on ponds and eat water plants.", tags=("birds",)),
            _chunk(real_embedder, "c2", "The stock market fell sharply on Tuesday.", source='we"ird\\source'),
            _chunk(real_embedder, "c3", "Ducks in another tenant.", tenant="t2"),
        ]
    )
    query = real_embedder.embed_query("where do ducks live?")
    hits = stores.chunks.search_dense(query, filter_from_request("t1"), 5)
    assert [h.chunk.chunk_id for h in hits][0] == "c1"
    assert all(h.chunk.tenant == "t1" for h in hits)
    assert -1.0 <= hits[0].score <= 1.0
    bm25 = stores.chunks.search_bm25("ducks", filter_from_request("t1"), 5)
    assert [h.chunk.chunk_id for h in bm25] == ["c1"] and bm25[0].score > 0
    tagged = stores.chunks.search_dense(query, filter_from_request("t1", tags=["birds"]), 5)
    assert [h.chunk.chunk_id for h in tagged] == ["c1"]
    odd = stores.chunks.search_dense(query, filter_from_request("t1", sources=['we"ird\\source']), 5)
    assert [h.chunk.chunk_id for h in odd] == ["c2"]
    assert stores.chunks.delete_chunks(f.eq(s.CHUNK_ID, "c2")) in (0, 1)
    assert stores.chunks.count_chunks(f.eq(s.TENANT, "t1")) == 1


@pytest.mark.parametrize("session_reads", [False, True], ids=["collection's consistency", "the writer's Session reads"])
def test_registry_round_trip_and_listing(milvus_settings: Settings, real_embedder, session_reads: bool) -> None:  # type: ignore[no-untyped-def]
    stores = open_milvus_stores(
        milvus_settings, model_id=real_embedder.model_id, dimension=real_embedder.dimension, writer=True
    )
    if session_reads:
        read_own_registry_writes(stores)
    record = DocumentRecord(
        tenant="t1",
        document_id="doc-a",
        source="a.txt",
        state=DocumentState.ACTIVE,
        generation="g1",
        tags=["x"],
        metadata={"k": "v"},
        pages_without_text=[2],
    )
    stores.registry.put(record)
    stores.registry.put(dataclasses.replace(record, document_id="doc-b", state=DocumentState.FAILED))
    found = stores.registry.get("t1", "doc-a")
    assert found is not None and found.metadata == {"k": "v"} and found.pages_without_text == [2]
    assert stores.registry.get("t2", "doc-a") is None
    assert [r.document_id for r in all_records(stores.registry, DocumentState.FAILED)] == ["doc-b"]
    by_tenant = f.FilterBuilder(s.REGISTRY_FILTERABLE_FIELDS).eq(s.TENANT, "t1")
    assert stores.registry.list_keys(by_tenant, limit=10) == ["t1/doc-a", "t1/doc-b"]
    assert stores.registry.list_keys(by_tenant, after="t1/doc-a", limit=10) == ["t1/doc-b"]
    assert stores.registry.read_lease() is None  # always read with Strong consistency


def test_other_model_is_refused(milvus_settings: Settings, real_embedder) -> None:  # type: ignore[no-untyped-def]
    open_milvus_stores(milvus_settings, model_id=real_embedder.model_id, dimension=real_embedder.dimension, writer=True)
    with pytest.raises(errors.ModelMismatchError) as caught:
        open_milvus_stores(milvus_settings, model_id="intfloat/e5-small", dimension=384, writer=False)
    assert "all-MiniLM-L6-v2" in caught.value.message and errors.status_name(caught.value) == "FAILED_PRECONDITION"


def test_reader_without_writer_gives_up_clearly(milvus_settings: Settings, real_embedder) -> None:  # type: ignore[no-untyped-def]
    fresh = dataclasses.replace(milvus_settings, collection_prefix=milvus_settings.collection_prefix + "_new")
    with pytest.raises(errors.PreconditionError, match="start the ingest service"):
        open_milvus_stores(
            fresh, model_id=real_embedder.model_id, dimension=real_embedder.dimension, writer=False, wait_s=1.0
        )


def test_writer_flush_on_milvus_lite(milvus_settings: Settings, real_embedder) -> None:  # type: ignore[no-untyped-def]
    """On milvus-lite the writer's flusher is on (`auto`), flushes what was written and the rows
    stay searchable afterwards."""
    from ragrpc.store.factory import wal_flusher

    stores = open_milvus_stores(
        milvus_settings, model_id=real_embedder.model_id, dimension=real_embedder.dimension, writer=True
    )
    flusher = wal_flusher(dataclasses.replace(milvus_settings, milvus_flush_idle_s=0.0), stores)
    assert flusher is not None and stores.setup.server_version.startswith("milvus_lite")
    stores.chunks.insert_chunks([_chunk(real_embedder, f"f{i}", f"Herons nest in colonies {i}.") for i in range(5)])
    assert stores.connection.unflushed_since is not None
    assert flusher.flush_if_due() and stores.connection.unflushed_since is None
    hits = stores.chunks.search_dense(real_embedder.embed_query("heron colonies"), filter_from_request("t1"), 5)
    assert {h.chunk.chunk_id for h in hits} == {f"f{i}" for i in range(5)}
    assert wal_flusher(dataclasses.replace(milvus_settings, milvus_flush="off"), stores) is None


def test_concurrent_writes_are_group_committed(milvus_settings: Settings, real_embedder) -> None:  # type: ignore[no-untyped-def]
    """Registry upserts and chunk inserts of 24 documents at once, with one document whose chunk
    does not fit the schema: every other document is stored whole, the bad one fails alone, and
    the writes left in fewer calls than there were writes; then registry reads at once share calls."""
    stores = open_milvus_stores(
        milvus_settings, model_id=real_embedder.model_id, dimension=real_embedder.dimension, writer=True
    )
    vector = real_embedder.embed_documents(["Ducks swim on ponds."])[0].tolist()
    start = threading.Barrier(24)
    failures: dict[int, Exception] = {}

    def write_document(n: int) -> None:
        document_id = f"doc-{n}"
        chunks = [
            dataclasses.replace(
                _chunk_with(vector, f"{document_id}-c{i}", f"text {n} {i}", document_id),
                vector=vector if n != 7 else vector[:10],  # document 7's vectors have the wrong dimension
            )
            for i in range(3)
        ]
        record = DocumentRecord(tenant="t1", document_id=document_id, state=DocumentState.PROCESSING)
        start.wait()
        try:
            stores.registry.put(record)
            stores.chunks.insert_chunks(chunks)
            record.state = DocumentState.ACTIVE
            stores.registry.put(record)
        except Exception as exc:  # noqa: BLE001 - collected for the assertions
            failures[n] = exc

    threads = [threading.Thread(target=write_document, args=(n,)) for n in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert list(failures) == [7] and isinstance(failures[7], errors.RagrpcError)
    assert stores.chunks.count_chunks(f.eq(s.TENANT, "t1")) == 23 * 3
    states = {r.document_id: r.state for r in all_records(stores.registry)}
    assert states.pop("doc-7") == DocumentState.PROCESSING
    assert set(states.values()) == {DocumentState.ACTIVE} and len(states) == 23
    groups = stores.connection.write_groups
    assert groups.writes == 24 * 3 - 1 and groups.calls < groups.writes
    # registry upserts and chunk inserts went to pymilvus' column path (ragrpc.store.column_writes)
    # (all but the calls that carried doc-7's refused rows: merged with others, then alone; or alone only)
    columns = stores.connection.column_writes
    assert groups.calls - 2 <= columns.calls <= groups.calls - 1 and not columns.by_rows

    # Registry reads of the 24 documents (and 8 that do not exist) at once: each reader gets its own
    # record, read after the writes above, and the reads share calls.
    found: dict[int, DocumentRecord | None] = {}
    start = threading.Barrier(32)

    def read_document(n: int) -> None:
        start.wait()
        found[n] = stores.registry.get("t1", f"doc-{n}")

    threads = [threading.Thread(target=read_document, args=(n,)) for n in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(found[n] is None for n in range(24, 32))
    assert {n: found[n].state for n in range(24)} == {  # type: ignore[union-attr]
        n: DocumentState.PROCESSING if n == 7 else DocumentState.ACTIVE for n in range(24)
    }
    assert all(found[n].document_id == f"doc-{n}" for n in range(24))  # type: ignore[union-attr]
    reads = stores.connection.read_groups
    assert reads.reads == 32 and reads.calls < reads.reads


def _chunk_with(vector: list[float], chunk_id: str, text: str, document_id: str) -> ChunkRecord:
    return ChunkRecord(
        chunk_id=chunk_id,
        document_id=document_id,
        tenant="t1",
        collection="default",
        generation="g1",
        text=text,
        vector=vector,
        chunk_index=0,
        chunker="fixed_tokens",
        source="a.txt",
    )


def test_milvus_bm25_scores_the_analysed_header_and_text(milvus_settings: Settings, real_embedder) -> None:  # type: ignore[no-untyped-def]
    """Schema 2: the BM25 function reads `bm25_text` (ragrpc.store.bm25_text), so a query finds other
    forms of a word (stems), words only the context header says (the title), and a question of stop
    words alone finds nothing rather than failing; callers still read the chunk's own text."""
    stores = open_milvus_stores(
        milvus_settings, model_id=real_embedder.model_id, dimension=real_embedder.dimension, writer=True
    )
    assert stores.setup.bm25_supported and stores.setup.bm25_analysed
    wetland = dataclasses.replace(
        _chunk(real_embedder, "c1", "Ducks were swimming on the ponds all morning."), title="Wetland survey 2019"
    )
    market = dataclasses.replace(
        _chunk(real_embedder, "c2", "The stock market fell sharply on Tuesday.", document_id="d2"),
        title="Market report",
    )
    stores.chunks.insert_chunks([wetland, market])
    tenant = filter_from_request("t1")
    stemmed = stores.chunks.search_bm25("duck swims in a pond", tenant, 5)
    assert [h.chunk.chunk_id for h in stemmed] == ["c1"]
    assert stemmed[0].chunk.text == "Ducks were swimming on the ponds all morning."  # not the indexed terms
    assert [h.chunk.chunk_id for h in stores.chunks.search_bm25("wetland", tenant, 5)] == ["c1"]
    assert stores.chunks.search_bm25("what is the ...?", tenant, 5) == []
    # an update of the title (UpsertChunks) re-indexes the header
    stores.chunks.upsert_chunks([dataclasses.replace(market, title="Heron census")])
    assert [h.chunk.chunk_id for h in stores.chunks.search_bm25("herons", tenant, 5)] == ["c2"]
    assert stores.chunks.search_bm25("market report", tenant, 5)[0].chunk.chunk_id == "c2"  # its text says market
    # the same terms are what the query service's rank_bm25 index loads instead of analysing again
    scanned = {c.chunk_id: c for page in stores.chunks.scan_chunks(tenant, with_bm25_terms=True) for c in page}
    assert scanned["c1"].bm25_terms == ("wetland", "survey", "2019", "duck", "swim", "pond", "morn")
    assert scanned["c2"].bm25_terms == ("heron", "census", "stock", "market", "fell", "sharpli", "tuesday")
    assert all(c.bm25_terms is None for page in stores.chunks.scan_chunks(tenant) for c in page)  # not asked


def test_a_schema_1_collection_is_still_searched_with_the_raw_query(milvus_settings: Settings, real_embedder) -> None:  # type: ignore[no-untyped-def]
    """A chunks collection created before schema 2 (BM25 over the raw `text`) is read and written
    as it is: no `bm25_text` is sent, and queries go to the server unanalysed."""
    from ragrpc.store.collections import CollectionNames, CollectionSetup
    from ragrpc.store.factory import connection_for, index_config

    connection = connection_for(milvus_settings, writer=True)
    CollectionSetup(
        connection,
        CollectionNames.with_prefix(milvus_settings.collection_prefix),
        index_config(milvus_settings),
        chunks_schema=1,
    ).ensure(real_embedder.model_id, real_embedder.dimension)
    connection.reset()
    stores = open_milvus_stores(
        milvus_settings, model_id=real_embedder.model_id, dimension=real_embedder.dimension, writer=True
    )
    assert stores.setup.bm25_supported and not stores.setup.bm25_analysed
    stores.chunks.insert_chunks([_chunk(real_embedder, "c1", "Ducks swim on ponds.")])
    tenant = filter_from_request("t1")
    assert [h.chunk.chunk_id for h in stores.chunks.search_bm25("ducks", tenant, 5)] == ["c1"]
    assert stores.chunks.search_bm25("duck", tenant, 5) == []  # Milvus' standard analyzer: no stems
    # no stored terms: the rank_bm25 index analyses the text itself
    assert [c.bm25_terms for page in stores.chunks.scan_chunks(tenant, with_bm25_terms=True) for c in page] == [None]
    index_scan = stores.chunks.scan_chunks(tenant, with_bm25_terms=True, index_fields_only=True)
    assert [c.text for page in index_scan for c in page] == ["Ducks swim on ponds."]  # the text to analyse


def test_the_writers_reads_by_key_see_its_own_writes(milvus_settings: Settings, real_embedder) -> None:  # type: ignore[no-untyped-def]
    """milvus-lite reports no write timestamps (and its reads never wait): the writer's reads by key keep
    the Session level and see every own write (the 2.3.5 server's per-key reads: tests/reliability)."""
    from tests.support.key_write_checks import check_the_writers_reads_by_key

    levels = check_the_writers_reads_by_key(milvus_settings, real_embedder.model_id, real_embedder.dimension)
    assert levels["Session"] >= 25 and levels["Strong"] == 0, levels  # before its first write: "eventually"
