"""One store contract, run against the in-memory fakes and a real milvus-lite server alike, with a
page size far below the collection's size, so that what the fakes let a unit test do is what
production does: every scan and listing pages through the whole collection in key order, one
query call is capped, an over-long VARCHAR fails its whole write, upsert replaces, deletes are
journalled for followers."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from ragrpc import errors
from ragrpc.analyzer import EnglishAnalyzer
from ragrpc.config import Settings
from ragrpc.models import ChunkKind, ChunkRecord, DocumentRecord, DocumentState
from ragrpc.store import filters as f
from ragrpc.store import paging
from ragrpc.store import schema as s
from ragrpc.store.bm25_text import Bm25Text
from ragrpc.store.factory import open_milvus_stores
from ragrpc.store.metadata_fields import MetadataFields
from ragrpc.store.paging import KEYED_SCAN_MIN_PAGES, MAX_QUERY_WINDOW
from ragrpc.store.request_filter import MetadataCondition, filter_from_request
from ragrpc.testing import InMemoryChunkStore, InMemoryDocumentRegistry, all_keys, all_records

PAGE = 7
DIM = 8
FACT_KEYS = ("organization", "ticker", "document_type", "fiscal_period")  # the collection's declared keys
REGISTRY = f.FilterBuilder(s.REGISTRY_FILTERABLE_FIELDS)


@dataclasses.dataclass
class Stores:
    chunks: Any
    registry: Any


@pytest.fixture(
    params=[
        "memory",
        pytest.param("milvus-lite", marks=pytest.mark.slow),
        pytest.param("milvus-lite-iterator", marks=pytest.mark.slow),
    ]
)
def stores(request: pytest.FixtureRequest) -> Iterator[Stores]:
    """milvus-lite: scans read keys first, then rows by key (as the factory opens a large collection);
    milvus-lite-iterator: scans page with an iterator (a small collection, and a Milvus server)."""
    if request.param == "memory":
        # it keeps each chunk's analysed terms, as a collection of chunks schema 2 does
        chunks = InMemoryChunkStore(
            page_size=PAGE, bm25_text=Bm25Text(EnglishAnalyzer()), metadata_fields=MetadataFields(FACT_KEYS)
        )
        yield Stores(chunks, InMemoryDocumentRegistry(page_size=PAGE))
        return
    milvus_settings: Settings = request.getfixturevalue("milvus_settings")
    configured = dataclasses.replace(
        milvus_settings, store_page_size=PAGE, index_type="FLAT", metadata_filter_keys=",".join(FACT_KEYS)
    )
    opened = open_milvus_stores(configured, model_id="contract/model", dimension=DIM, writer=True)
    assert opened.chunks.key_scan_from_rows == opened.registry.key_scan_from_rows == KEYED_SCAN_MIN_PAGES * PAGE
    keyed = request.param == "milvus-lite"
    opened.chunks.key_scan_from_rows = opened.registry.key_scan_from_rows = 0 if keyed else None
    yield Stores(opened.chunks, opened.registry)


def _vector(seed: int) -> list[float]:
    v = np.random.default_rng(seed).normal(size=DIM)
    return (v / np.linalg.norm(v)).tolist()


def _chunk(i: int, document_id: str = "big", generation: str = "g1", text: str = "") -> ChunkRecord:
    return ChunkRecord(
        chunk_id=f"c{i:04d}-{document_id}-{generation}",
        document_id=document_id,
        tenant="t1",
        collection="default",
        generation=generation,
        text=text or f"chunk number {i} of {document_id}",
        vector=_vector(i),
        chunk_index=i,
        chunker="fixed_tokens",
        kind=ChunkKind.RETRIEVABLE,
    )


def _record(document_id: str, state: DocumentState = DocumentState.ACTIVE) -> DocumentRecord:
    return DocumentRecord(tenant="t1", document_id=document_id, collection="default", state=state, generation="g1")


def test_scans_page_through_every_chunk_in_key_order(stores: Stores) -> None:
    chunks = [_chunk(i) for i in range(5 * PAGE + 3)]
    stores.chunks.insert_chunks(chunks)
    pages = list(stores.chunks.scan_chunks(f.eq(s.DOCUMENT_ID, "big")))
    ids = [c.chunk_id for page in pages for c in page]
    assert ids == sorted(c.chunk_id for c in chunks)
    assert len(pages) == 6 and all(len(page) <= PAGE for page in pages)
    assert all(c.vector == [] for page in pages for c in page)
    scanned = stores.chunks.scan_chunks(f.eq(s.DOCUMENT_ID, "big"), with_vectors=True)
    with_vectors = [c for page in scanned for c in page]
    assert len(with_vectors) == len(chunks) and np.allclose(with_vectors[0].vector, chunks[0].vector, atol=1e-6)
    assert stores.chunks.count_chunks(f.eq(s.DOCUMENT_ID, "big")) == len(chunks)


def test_a_scan_for_an_index_reads_the_terms_but_not_the_text(stores: Stores) -> None:
    assert not set(s.NOT_INDEXED_FIELDS) & set(s.FILTERABLE_FIELDS)  # no filter tests what is not read
    chunks = [
        dataclasses.replace(
            _chunk(i, text=f"Herons number {i} wade in the shallows"),
            title="Field guide",
            section_path=("Birds", "Herons"),
            content_hash="sha-1",
            tags=("birds",),
        )
        for i in range(2 * PAGE + 1)
    ]
    stores.chunks.insert_chunks(chunks)
    expr = f.eq(s.DOCUMENT_ID, "big")
    full = [c for page in stores.chunks.scan_chunks(expr, with_bm25_terms=True) for c in page]
    lean = [c for page in stores.chunks.scan_chunks(expr, with_bm25_terms=True, index_fields_only=True) for c in page]
    assert all(c.bm25_terms and "heron" in c.bm25_terms for c in lean)
    assert all(c.text == c.title == c.content_hash == "" and c.section_path == () for c in lean)
    blanked = [dataclasses.replace(c, text="", title="", content_hash="", section_path=()) for c in full]
    assert lean == blanked and full[0].text.startswith("Herons number")
    # without the terms, nothing is left out: the text is what an index would analyse
    plain = [c for page in stores.chunks.scan_chunks(expr, index_fields_only=True) for c in page]
    assert [c.text for c in plain] == [c.text for c in full] and all(c.bm25_terms is None for c in plain)
    # a read by key gives the same (the query service reads a changed generation's chunks so)
    ids = [c.chunk_id for c in full]
    by_key = sorted(
        stores.chunks.get_chunks(ids, with_bm25_terms=True, index_fields_only=True), key=lambda c: c.chunk_id
    )
    assert by_key == lean
    assert sorted(stores.chunks.get_chunks(ids, with_bm25_terms=True), key=lambda c: c.chunk_id) == full


def test_one_query_call_is_capped(stores: Stores) -> None:
    stores.chunks.insert_chunks([_chunk(i) for i in range(3)])
    assert len(stores.chunks.query_chunks(f.eq(s.DOCUMENT_ID, "big"), 2)) == 2
    with pytest.raises(errors.InternalError, match="scan"):
        stores.chunks.query_chunks(f.eq(s.DOCUMENT_ID, "big"), MAX_QUERY_WINDOW + 1)


def test_delete_by_filter_removes_more_than_a_page(stores: Stores) -> None:
    stores.chunks.insert_chunks([_chunk(i) for i in range(4 * PAGE)] + [_chunk(0, document_id="other")])
    stores.chunks.delete_chunks(f.eq(s.DOCUMENT_ID, "big"))
    assert stores.chunks.count_chunks(f.eq(s.DOCUMENT_ID, "big")) == 0
    assert stores.chunks.count_chunks(f.eq(s.DOCUMENT_ID, "other")) == 1


def test_upsert_replaces_rows_of_the_same_id(stores: Stores) -> None:
    stores.chunks.insert_chunks([_chunk(i) for i in range(PAGE + 1)])
    stores.chunks.upsert_chunks([dataclasses.replace(_chunk(i), text=f"new text {i}") for i in range(PAGE + 1)])
    found = [c for page in stores.chunks.scan_chunks(f.eq(s.DOCUMENT_ID, "big")) for c in page]
    assert len(found) == PAGE + 1 and all(c.text.startswith("new text") for c in found)


def test_an_over_long_varchar_fails_the_whole_write(stores: Stores) -> None:
    too_long = "x" * (s.VARCHAR_LIMITS[s.TEXT] + 1)
    with pytest.raises(errors.RagrpcError):
        stores.chunks.insert_chunks([_chunk(0, document_id="bad"), _chunk(1, document_id="bad", text=too_long)])
    assert stores.chunks.count_chunks(f.eq(s.DOCUMENT_ID, "bad")) == 0


def test_registry_listing_is_keyset_paged(stores: Stores) -> None:
    ids = [f"doc-{i:03d}" for i in range(3 * PAGE + 2)]
    for i, document_id in enumerate(ids):
        stores.registry.put(_record(document_id, DocumentState.FAILED if i % 4 == 0 else DocumentState.ACTIVE))
    tenant = REGISTRY.eq(s.TENANT, "t1")
    listed, after = [], ""
    while True:
        page = stores.registry.list_keys(tenant, after=after, limit=PAGE - 2)
        if not page:
            break
        listed += page
        after = page[-1]
    assert listed == [f"t1/{d}" for d in ids]
    assert all_keys(stores.registry, tenant) == listed
    failed = [r.document_id for r in all_records(stores.registry, DocumentState.FAILED)]
    assert failed == [d for i, d in enumerate(ids) if i % 4 == 0]
    pages = list(stores.registry.scan(REGISTRY.eq(s.STATE, int(DocumentState.ACTIVE))))
    assert all(len(p) <= PAGE for p in pages) and sum(map(len, pages)) == len(ids) - len(failed)


def test_every_row_a_scan_returns_matches_its_filter_while_rows_change(stores: Stores) -> None:
    ids = [f"doc-{i:03d}" for i in range(6 * PAGE)]
    for document_id in ids:
        stores.registry.put(_record(document_id))
    scan = stores.registry.scan(REGISTRY.eq(s.STATE, int(DocumentState.ACTIVE)))
    first = next(scan)
    # rows of the last page (a scan reads at most two pages ahead): one fails, one is deleted, one is renamed
    failed, deleted, renamed = ids[-3], ids[-2], ids[-1]
    stores.registry.put(_record(failed, DocumentState.FAILED))
    stores.registry.delete("t1", deleted)
    stores.registry.put(dataclasses.replace(_record(renamed), title="renamed"))
    returned = first + [record for page in scan for record in page]
    assert all(record.state == DocumentState.ACTIVE for record in returned)  # the filter holds on every row
    returned_ids = [record.document_id for record in returned]
    assert returned_ids == sorted(set(returned_ids))  # once each, in key order
    assert set(ids[:-3]) <= set(returned_ids) and renamed in returned_ids


def test_deletes_are_journalled_for_followers(stores: Stores) -> None:
    for document_id in ("a", "b", "c"):
        stores.registry.put(_record(document_id))
    stores.registry.delete("t1", "b")
    journalled = [key for page in stores.registry.deleted_since(0) for key in page]
    assert journalled == ["t1/b"] and stores.registry.get("t1", "b") is None
    stores.registry.purge_deletions(older_than=2**40)
    assert [key for page in stores.registry.deleted_since(0) for key in page] == []
    assert all_keys(stores.registry, REGISTRY.eq(s.TENANT, "t1")) == ["t1/a", "t1/c"]


def test_changes_are_journalled_for_followers(stores: Stores) -> None:
    before = int(time.time()) - 1
    stores.registry.journal_changes(["t1/a", "t1/b"])
    stores.registry.journal_changes(["t1/a"])  # one entry a document, the newest time
    entries = [entry for page in stores.registry.changed_since(before) for entry in page]
    assert sorted(key for key, _ in entries) == ["t1/a", "t1/b"] and all(at > before for _, at in entries)
    assert [entry for page in stores.registry.changed_since(int(time.time()) + 5) for entry in page] == []
    assert [key for page in stores.registry.deleted_since(0) for key in page] == []  # another journal
    stores.registry.purge_changes(older_than=2**40)
    assert [entry for page in stores.registry.changed_since(0) for entry in page] == []


def test_get_by_id_returns_the_rows_that_exist(stores: Stores) -> None:
    chunks = [_chunk(i) for i in range(PAGE + 2)]
    stores.chunks.insert_chunks(chunks)
    wanted = [chunks[0].chunk_id, "no-such-chunk", chunks[-1].chunk_id]
    found = {c.chunk_id: c for c in stores.chunks.get_chunks(wanted)}
    assert set(found) == {chunks[0].chunk_id, chunks[-1].chunk_id} and found[chunks[0].chunk_id].vector == []
    with_vectors = stores.chunks.get_chunks([chunks[1].chunk_id], with_vectors=True)
    assert np.allclose(with_vectors[0].vector, chunks[1].vector, atol=1e-6) and with_vectors[0].text == chunks[1].text
    assert stores.chunks.get_chunks([]) == []


def test_concurrent_reads_by_key_of_other_fields_each_get_the_fields_they_asked_for(stores: Stores) -> None:
    """Reads by key that wait behind a running one are fetched together (read_groups); a read of the BM25
    terms or of the vectors must never be served by a call that asked for other fields (on 2026-12-08 the
    query service's registry follower, reading terms while queries read plain rows, failed on rows
    without them and the service went NOT_SERVING)."""
    chunks = [_chunk(i, text=f"Herons number {i} wade in the shallows") for i in range(3 * PAGE)]
    stores.chunks.insert_chunks(chunks)
    ids = [c.chunk_id for c in chunks]
    problems: list[str] = []

    def reader(number: int) -> None:
        for round_ in range(12):
            wanted = ids[(number + round_) % len(ids) :][:5] or ids[:5]
            kind = (number + round_) % 3
            try:
                if kind == 0:
                    got = stores.chunks.get_chunks(wanted, with_bm25_terms=True, index_fields_only=True)
                    if not all(c.bm25_terms and "heron" in c.bm25_terms for c in got):
                        problems.append(f"a read of the terms got {[c.bm25_terms for c in got]}")
                elif kind == 1:
                    got = stores.chunks.get_chunks(wanted, with_vectors=True)
                    if not all(len(c.vector) == DIM for c in got):
                        problems.append("a read of the vectors got rows without them")
                else:
                    got = stores.chunks.get_chunks(wanted)
                    if not all(c.text.startswith("Herons") and c.vector == [] for c in got):
                        problems.append("a plain read got rows of another shape")
                if len(got) != len(wanted):
                    problems.append(f"{len(got)} of {len(wanted)} rows")
            except errors.RagrpcError as exc:
                problems.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=reader, args=(n,)) for n in range(9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert problems == []


def test_a_filter_on_declared_metadata_keys_selects_by_exact_value(stores: Stores) -> None:
    facts = [
        {"organization": "Amazon.com, Inc.", "ticker": "AMZN", "document_type": "10-K", "fiscal_period": "FY2017"},
        {"organization": "Amazon.com, Inc.", "document_type": "10-Q", "fiscal_period": "2018-Q2"},
        {"organization": "Apple Inc.", "ticker": "AAPL", "document_type": "10-K", "fiscal_period": "FY2017"},
        {},
    ]
    chunks = [dataclasses.replace(_chunk(i, document_id=f"d{i}"), metadata=m) for i, m in enumerate(facts)]
    stores.chunks.insert_chunks(chunks)

    def found(**wanted: list[str]) -> set[str]:
        conditions = [MetadataCondition(key, tuple(values)) for key, values in wanted.items()]
        expr = filter_from_request("t1", metadata=conditions, fields=stores.chunks.metadata_fields)
        hits = stores.chunks.search_dense(np.array(_vector(0), dtype=np.float32), expr, 10)
        by_query = {c.document_id for c in stores.chunks.query_chunks(expr, limit=10)}
        assert {h.chunk.document_id for h in hits} == by_query  # search and query filter alike
        return by_query

    assert found(organization=["Amazon.com, Inc."]) == {"d0", "d1"}
    assert found(organization=["Amazon.com, Inc."], document_type=["10-K"]) == {"d0"}
    assert found(fiscal_period=["FY2017"], document_type=["10-K", "10-Q"]) == {"d0", "d2"}
    assert found(organization=["amazon.com, inc."]) == set()  # exact values
    assert found(ticker=["AAPL", "AMZN"]) == {"d0", "d2"} and found(ticker=["AMZN"], fiscal_period=["2018-Q2"]) == set()
    with pytest.raises(errors.InvalidInputError) as refused:
        filter_from_request("t1", metadata=[MetadataCondition("author", ("x",))], fields=stores.chunks.metadata_fields)
    assert "'author' is not declared" in refused.value.message


@pytest.mark.slow
def test_milvus_lite_scans_by_key_from_the_collections_size(
    milvus_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Which way a scan of more than one page reads is the collection's row count against the store's
    `key_scan_from_rows`; both ways return the same rows."""
    configured = dataclasses.replace(milvus_settings, store_page_size=PAGE, index_type="FLAT")
    chunks = open_milvus_stores(configured, model_id="contract/model", dimension=DIM, writer=True).chunks
    rows = 3 * PAGE + 1
    chunks.insert_chunks([_chunk(i) for i in range(rows)] + [_chunk(0, document_id="other")])
    ways: list[str] = []
    for name in ("_read_by_key", "_iterate"):
        real = getattr(paging, name)
        monkeypatch.setattr(
            paging, name, lambda *a, _real=real, _name=name, **k: (ways.append(_name), _real(*a, **k))[1]
        )
    found = {}
    for from_rows, way in ((rows + 1, "_read_by_key"), (rows + 2, "_iterate"), (None, "_iterate"), (0, "_read_by_key")):
        chunks.key_scan_from_rows = from_rows
        ways.clear()
        found[from_rows] = [c.chunk_id for page in chunks.scan_chunks(f.eq(s.DOCUMENT_ID, "big")) for c in page]
        assert ways == [way], from_rows
    assert all(ids == sorted(_chunk(i).chunk_id for i in range(rows)) for ids in found.values())
