"""Generic metadata filters: the keys a collection declares (RAGRPC_METADATA_FILTER_KEYS, each a typed
VARCHAR field `meta_<key>`), exact matches on them built only for declared keys with typed, escaped
values, the deprecated MetadataFilter fields as aliases (matched in the metadata JSON on collections
created before keys could be declared), and the same filter on the in-memory store and in the query
service's in-process indexes."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest

from ingest_service.app import build_components as build_ingest
from ingest_service.requests import DocumentSpecInput, IngestItem
from query_service.convert import metadata_conditions
from query_service.index_sync import indexed_chunk
from ragrpc import errors
from ragrpc.config import Settings
from ragrpc.models import ChunkKind, ChunkRecord, DocumentState
from ragrpc.store import schema as s
from ragrpc.store.metadata_fields import MetadataFields, follow_recorded, parse_keys
from ragrpc.store.request_filter import MetadataCondition, filter_from_request, implied_conditions
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry
from ragrpc.v1 import retrieve_pb2

DECLARED = MetadataFields(("department", "language"))
LEGACY = MetadataFields(legacy=True)


def _where(*conditions: MetadataCondition, fields: MetadataFields = DECLARED) -> str:
    return filter_from_request("acme", metadata=conditions, fields=fields).render()


def _refused(*conditions: MetadataCondition, fields: MetadataFields = DECLARED) -> errors.InvalidInputError:
    with pytest.raises(errors.InvalidInputError) as refused:
        filter_from_request("acme", metadata=conditions, fields=fields)
    return refused.value


def test_the_setting_declares_lower_case_identifiers_each_once() -> None:
    assert Settings().metadata_filter_keys == "" and parse_keys("") == ()
    assert parse_keys(" department, language ,department") == ("department", "language")
    for bad in ("Department", "9lives", "a-b", "x" * 49, 'x"]'):
        with pytest.raises(errors.PreconditionError) as refused:
            parse_keys(bad)
        assert "RAGRPC_METADATA_FILTER_KEYS" in refused.value.message and repr(bad) in refused.value.message
    with pytest.raises(errors.PreconditionError, match="at most 16 keys"):
        parse_keys(",".join(f"k{i}" for i in range(17)))


def test_a_declared_key_is_an_exact_match_on_its_own_field() -> None:
    expr = _where(MetadataCondition("department", ("sales", "legal")), MetadataCondition("language", ("de",)))
    assert (
        expr == 'tenant == "acme" and kind == 0 and meta_department in ["sales", "legal"] and meta_language in ["de"]'
    )
    hostile = _where(MetadataCondition("department", ('x" or tenant != "', "back\\slash")))
    assert 'meta_department in ["x\\" or tenant != \\"", "back\\\\slash"]' in hostile
    assert _where(MetadataCondition("department", ())) == 'tenant == "acme" and kind == 0'  # no values: no condition


@pytest.mark.parametrize(
    ("condition", "field", "says"),
    [
        (
            MetadataCondition("team", ("x",)),
            "options.filter.metadata[team]",
            "'team' is not declared on this collection",
        ),
        (MetadataCondition("Team", ("x",)), "options.filter.metadata[Team]", "not a metadata key"),
        (MetadataCondition("department", ("",)), "options.filter.metadata[department]", "non-empty"),
        (MetadataCondition("department", ("a\x00b",)), "options.filter.metadata[department]", "U+0000 is not allowed"),
        (MetadataCondition("department", ("x" * 513,)), "options.filter.metadata[department]", "longer than 512"),
        (MetadataCondition("ticker", ("AMD",), "options.filter.tickers", True), "options.filter.tickers", "ticker"),
    ],
)
def test_a_filter_the_collection_cannot_apply_names_the_request_field(
    condition: MetadataCondition, field: str, says: str
) -> None:
    refused = _refused(condition)
    assert refused.field_violations[0][0] == field and says in refused.message
    if "not declared" in says:
        assert refused.reason == "METADATA_KEY_NOT_DECLARED" and "department, language" in refused.message


def test_a_key_given_twice_is_refused() -> None:
    refused = _refused(
        MetadataCondition("department", ("a",)),
        MetadataCondition("department", ("b",), "options.filter.tickers", deprecated_alias=True),
    )
    assert "filtered twice" in refused.message and refused.field_violations[0][0] == "options.filter.tickers"


def test_on_a_legacy_collection_only_the_deprecated_fields_filter_in_the_metadata_json() -> None:
    alias = MetadataCondition("ticker", ("AMD", "NVDA"), "options.filter.tickers", deprecated_alias=True)
    assert _where(alias, fields=LEGACY).endswith('(metadata["ticker"] == "AMD" or metadata["ticker"] == "NVDA")')
    refused = _refused(MetadataCondition("ticker", ("AMD",)), fields=LEGACY)
    assert "created before metadata keys could be declared" in refused.message and "re-create" in refused.message
    # on a collection that declares keys, an alias is the key's own field
    assert _where(alias, fields=MetadataFields(("ticker",))).endswith('meta_ticker in ["AMD", "NVDA"]')


def test_the_request_converts_the_map_and_the_deprecated_fields_as_aliases() -> None:
    flt = retrieve_pb2.MetadataFilter(tickers=["AMD"], fiscal_periods=["FY2022"])
    flt.metadata["department"].values.extend(["sales"])
    conditions = metadata_conditions(flt)
    assert [(c.key, c.values, c.request_field, c.deprecated_alias) for c in conditions] == [
        ("department", ("sales",), "options.filter.metadata[department]", False),
        ("ticker", ("AMD",), "options.filter.tickers", True),
        ("fiscal_period", ("FY2022",), "options.filter.fiscal_periods", True),
    ]
    empty = retrieve_pb2.MetadataFilter()
    empty.metadata["department"].SetInParent()
    with pytest.raises(errors.InvalidInputError, match="needs at least one value") as refused:
        metadata_conditions(empty)
    assert refused.value.field_violations[0][0] == "options.filter.metadata[department]"


def test_implied_filters_apply_to_declared_keys_the_request_leaves_open() -> None:
    asked = [MetadataCondition("department", ("legal",))]
    implied = {"department": ("sales",), "language": ("de",), "team": ("x",), "region": ()}
    assert [(c.key, c.values) for c in implied_conditions(implied, asked, DECLARED)] == [("language", ("de",))]


def _chunk(number: int, metadata: dict[str, str]) -> ChunkRecord:
    vector = np.random.default_rng(number).normal(size=8)
    return ChunkRecord(
        chunk_id=f"c{number}",
        document_id=f"d{number}",
        tenant="acme",
        collection="default",
        generation="g1",
        text=f"chunk {number}",
        vector=(vector / np.linalg.norm(vector)).tolist(),
        chunk_index=0,
        chunker="fixed_tokens",
        kind=ChunkKind.RETRIEVABLE,
        metadata=metadata,
    )


CHUNKS = [
    _chunk(0, {"department": "sales", "language": "de"}),
    _chunk(1, {"department": "legal", "language": "de", "ticker": "AMD"}),
    _chunk(2, {"department": "sales", "language": "en"}),
    _chunk(3, {}),
]


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ([MetadataCondition("department", ("sales",))], {"d0", "d2"}),
        ([MetadataCondition("department", ("sales", "legal")), MetadataCondition("language", ("de",))], {"d0", "d1"}),
        ([MetadataCondition("language", ("fr",))], set()),
        ([MetadataCondition("department", ("Sales",))], set()),  # exact values
    ],
)
def test_the_in_memory_store_and_the_in_process_indexes_select_alike(
    conditions: list[MetadataCondition], expected: set[str]
) -> None:
    store = InMemoryChunkStore(metadata_fields=DECLARED)
    store.insert_chunks(CHUNKS)
    expr = filter_from_request("acme", metadata=conditions, fields=DECLARED)
    by_store = {c.document_id for c in store.query_chunks(expr, limit=10)}
    hits = store.search_dense(np.array(CHUNKS[0].vector, dtype=np.float32), expr, 10)
    in_process = {c.document_id for c in CHUNKS if expr.matches(indexed_chunk(c).attrs)}
    assert by_store == {h.chunk.document_id for h in hits} == in_process == expected


def test_the_legacy_json_filter_matches_the_store_rows_and_the_index_attributes_alike() -> None:
    alias = MetadataCondition("ticker", ("AMD",), "options.filter.tickers", deprecated_alias=True)
    expr = filter_from_request("acme", metadata=[alias], fields=LEGACY)
    store = InMemoryChunkStore(metadata_fields=LEGACY)
    store.insert_chunks(CHUNKS)
    assert {c.document_id for c in store.query_chunks(expr, limit=10)} == {"d1"}
    assert {c.document_id for c in CHUNKS if expr.matches(indexed_chunk(c).attrs)} == {"d1"}


def test_rows_carry_the_declared_fields_and_refuse_a_value_longer_than_its_field() -> None:
    assert DECLARED.row_values({"department": "sales", "other": "x"}) == {
        "meta_department": "sales",
        "meta_language": "",
    }
    store = InMemoryChunkStore(metadata_fields=DECLARED)
    too_long = _chunk(9, {"language": "é" * 257})  # 514 bytes in UTF-8
    with pytest.raises(errors.InvalidInputError) as refused:
        store.insert_chunks([CHUNKS[0], too_long])
    assert "metadata 'language' is 514 bytes" in refused.value.message
    assert refused.value.field_violations[0][0] == "metadata[language]"
    assert store.count_chunks(filter_from_request("acme")) == 0  # nothing of the call is stored


async def test_ingestion_refuses_a_declared_value_longer_than_its_field_naming_the_key() -> None:
    settings = dataclasses.replace(Settings(), workers=2, metadata_filter_keys="department")
    chunks, registry = InMemoryChunkStore(metadata_fields=MetadataFields(("department",))), InMemoryDocumentRegistry()
    ingest = build_ingest(settings, HashingEmbedder(), chunks, registry)
    spec = DocumentSpecInput(document_id="d1", file_name="d1.txt", metadata={"department": "x" * 600})
    with pytest.raises(errors.InvalidInputError) as refused:
        await ingest.pipeline.ingest(IngestItem("t1", spec, b"Some text about the sales department."))
    assert (
        "metadata 'department' is 600 bytes" in refused.value.message
        and refused.value.reason == "METADATA_VALUE_TOO_LONG"
    )
    record = registry.get("t1", "d1")
    assert record is not None and record.state == DocumentState.FAILED and "'department'" in record.error
    ok = DocumentSpecInput(document_id="d2", file_name="d2.txt", metadata={"department": "sales", "notes": "y" * 600})
    assert (await ingest.pipeline.ingest(IngestItem("t1", ok, b"Some text."))).chunks_written == 1
    ingest.shutdown()


def test_a_setting_that_differs_from_the_collection_is_logged_and_the_collection_followed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="ragrpc.store.metadata_fields"):
        assert follow_recorded(DECLARED, ("department", "language"), "c") == DECLARED
        assert follow_recorded(DECLARED, (), "c") == DECLARED  # no setting (a query service): quietly
        assert not caplog.records
        assert follow_recorded(DECLARED, ("team",), "c_chunks") == DECLARED
        assert follow_recorded(LEGACY, ("team",), "old_chunks") == LEGACY
    first, second = (r.getMessage() for r in caplog.records)
    assert "RAGRPC_METADATA_FILTER_KEYS=team differs" in first and "(department, language)" in first
    assert "old_chunks was created before metadata keys could be declared" in second and "re-create" in second


def test_the_index_keeps_metadata_as_plain_attributes() -> None:
    attrs = indexed_chunk(_chunk(5, {"department": "sales", "Bad Key": "x", "n": 3})).attrs  # type: ignore[dict-item]
    assert attrs["meta_department"] == "sales" and s.METADATA not in attrs
    assert not any(name.startswith("meta_") and name != "meta_department" for name in attrs)


async def test_an_update_refuses_a_declared_value_longer_than_its_field_before_writing() -> None:
    settings = dataclasses.replace(Settings(), workers=2, metadata_filter_keys="department")
    chunks, registry = InMemoryChunkStore(metadata_fields=MetadataFields(("department",))), InMemoryDocumentRegistry()
    ingest = build_ingest(settings, HashingEmbedder(), chunks, registry)
    spec = DocumentSpecInput(document_id="d1", file_name="d1.txt", metadata={"department": "sales"})
    await ingest.pipeline.ingest(IngestItem("t1", spec, b"Some text about the sales department."))
    before = registry.get("t1", "d1")
    with pytest.raises(errors.InvalidInputError) as refused:
        await ingest.documents.update("t1", "d1", fields=["metadata"], metadata={"department": "x" * 600})
    assert refused.value.reason == "METADATA_VALUE_TOO_LONG"
    assert registry.get("t1", "d1") == before and ingest.lifecycle.unsettled == 0
    ingest.shutdown()
