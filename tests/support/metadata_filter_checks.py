"""Generic metadata filters on a real Milvus server (milvus-lite, Milvus 2.3.5): one check, run by
tests/integration/test_metadata_filters_milvus.py and tests/reliability/test_milvus_235.py.

A collection created with declared keys has a VARCHAR field of its own per key and records the keys in
its description; a filter on them selects the same chunks in a dense search, a query and a scan (by
iterator and by key), for values with quotes and backslashes; a value longer than its field fails the
write, naming the key; a service with another setting follows the record. A collection created before
keys could be declared filters the deprecated fields' keys in its metadata JSON and refuses others."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from ragrpc import errors
from ragrpc.config import Settings
from ragrpc.models import ChunkKind, ChunkRecord
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.store.collections import CollectionNames, CollectionSetup
from ragrpc.store.factory import connection_for, index_config, open_milvus_stores
from ragrpc.store.metadata_fields import MAX_VALUE_BYTES, MetadataFields
from ragrpc.store.milvus_chunks import MilvusChunkStore
from ragrpc.store.request_filter import MetadataCondition, filter_from_request

MODEL, DIM, PAGE = "test/metadata-filters", 8, 7
KEYS = ("department", "language", "ticker")
HOSTILE = 'R&D "labs" \\ west'


def _vector(seed: int) -> list[float]:
    v = np.random.default_rng(seed).normal(size=DIM)
    return (v / np.linalg.norm(v)).tolist()


def _chunk(i: int, metadata: dict[str, str]) -> ChunkRecord:
    return ChunkRecord(
        chunk_id=f"c{i:04d}",
        document_id=f"d{i % 5}",
        tenant="t1",
        collection="default",
        generation="g1",
        text=f"chunk number {i}",
        vector=_vector(i),
        chunk_index=i,
        chunker="fixed_tokens",
        kind=ChunkKind.RETRIEVABLE,
        metadata=metadata,
    )


def _metadata(i: int) -> dict[str, str]:
    """Document d0: sales/de/AMD; d1: legal/de; d2: the hostile department/en; d3, d4: none."""
    return [
        {"department": "sales", "language": "de", "ticker": "AMD"},
        {"department": "legal", "language": "de", "notes": "x" * 600},  # an undeclared key may be long
        {"department": HOSTILE, "language": "en"},
        {},
        {"other": "sales"},
    ][i % 5]


def _documents(chunks: Any, expr: f.FilterExpr) -> set[str]:
    """The documents `expr` selects, the same by dense search, query and scan (asserted)."""
    hits = chunks.search_dense(np.array(_vector(0), dtype=np.float32), expr, 100)
    queried = {c.document_id for c in chunks.query_chunks(expr, limit=100)}
    scanned = {c.document_id for page in chunks.scan_chunks(expr) for c in page}
    assert {h.chunk.document_id for h in hits} == queried == scanned, (expr.render(), queried, scanned)
    return queried


def check_metadata_filters(settings: Settings, prefix: str) -> list[tuple[str, str]]:
    """Runs the checks on the server `settings` names; returns (what, result) rows for a report."""
    rows: list[tuple[str, str]] = []
    configured = dataclasses.replace(
        settings,
        collection_prefix=prefix,
        metadata_filter_keys=",".join(KEYS),
        store_page_size=PAGE,
        index_type="FLAT",
    )
    keyed = open_milvus_stores(configured, model_id=MODEL, dimension=DIM, writer=True)
    names = CollectionNames.with_prefix(prefix)
    info = keyed.connection.call(lambda c: c.describe_collection(names.chunks))
    declared = {fld["name"]: fld for fld in info["fields"] if fld["name"].startswith(s.METADATA_FIELD_PREFIX)}
    assert set(declared) == {s.metadata_field(key) for key in KEYS}, declared
    assert keyed.setup.metadata_fields == MetadataFields(KEYS) and keyed.chunks.metadata_fields.keys == KEYS
    rows.append(("declared keys", f"{len(declared)} VARCHAR fields ({', '.join(sorted(declared))})"))

    chunks = [_chunk(i, _metadata(i)) for i in range(4 * PAGE)]
    keyed.chunks.insert_chunks(chunks)
    fields = keyed.chunks.metadata_fields

    def where(*conditions: MetadataCondition) -> f.FilterExpr:
        return filter_from_request("t1", metadata=conditions, fields=fields)

    cases = [
        ((MetadataCondition("department", ("sales",)),), {"d0"}),
        ((MetadataCondition("language", ("de",)),), {"d0", "d1"}),
        ((MetadataCondition("department", ("sales", "legal")), MetadataCondition("language", ("de",))), {"d0", "d1"}),
        ((MetadataCondition("department", (HOSTILE,)),), {"d2"}),
        ((MetadataCondition("department", ("Sales",)),), set()),
        ((MetadataCondition("ticker", ("AMD",), "options.filter.tickers", deprecated_alias=True),), {"d0"}),
    ]
    for conditions, expected in cases:
        assert _documents(keyed.chunks, where(*conditions)) == expected, conditions
    keyed.chunks.key_scan_from_rows = 0  # scans read the matching keys, then the rows by key (milvus-lite's way)
    assert {c.document_id for p in keyed.chunks.scan_chunks(where(*cases[2][0])) for c in p} == {"d0", "d1"}
    keyed.chunks.key_scan_from_rows = None
    rows.append(("exact matches", f"{len(cases)} filters alike in search, query and scan, quotes and backslashes"))

    before = keyed.chunks.count_chunks(filter_from_request("t1"))
    too_long = _chunk(999, {"language": "é" * (MAX_VALUE_BYTES // 2 + 1)})
    with pytest.raises(errors.InvalidInputError) as refused:
        keyed.chunks.insert_chunks([_chunk(998, {"language": "fr"}), too_long])
    assert (
        "metadata 'language'" in refused.value.message and refused.value.field_violations[0][0] == "metadata[language]"
    )
    assert keyed.chunks.count_chunks(filter_from_request("t1")) == before
    rows.append(("value over 512 bytes", f"INVALID_ARGUMENT: {refused.value.message[:60]}..."))

    with pytest.raises(errors.InvalidInputError) as undeclared:
        where(MetadataCondition("team", ("x",)))
    assert undeclared.value.reason == "METADATA_KEY_NOT_DECLARED"

    other = open_milvus_stores(
        dataclasses.replace(configured, metadata_filter_keys="team"), model_id=MODEL, dimension=DIM, writer=False
    )
    assert other.setup.metadata_fields == MetadataFields(KEYS)  # the collection's record, not the setting
    rows.append(("another setting", "follows the collection's record (a warning names both)"))

    legacy = _legacy_chunks(configured, f"{prefix}_old")
    legacy.insert_chunks(chunks)
    assert legacy.metadata_fields.legacy
    alias = MetadataCondition("ticker", ("AMD",), "options.filter.tickers", deprecated_alias=True)
    legacy_where = filter_from_request("t1", metadata=[alias], fields=legacy.metadata_fields)
    assert 'metadata["ticker"]' in legacy_where.render()
    assert _documents(legacy, legacy_where) == {"d0"}
    with pytest.raises(errors.InvalidInputError, match="created before metadata keys could be declared"):
        filter_from_request("t1", metadata=[MetadataCondition("ticker", ("AMD",))], fields=legacy.metadata_fields)
    rows.append(("collection created before", "deprecated fields filter the metadata JSON; other keys refused"))
    return rows


def _legacy_chunks(settings: Settings, prefix: str) -> MilvusChunkStore:
    """A chunks collection as created before keys could be declared: no fields, and a model record without keys."""
    connection = connection_for(settings, writer=True)
    connection.wait_until_ready(60.0)
    names, index = CollectionNames.with_prefix(prefix), index_config(settings)
    setup = CollectionSetup(connection, names, index, metadata_keys=None)
    setup.ensure(MODEL, DIM)
    return MilvusChunkStore(connection, names, index, setup, page_size=PAGE)
