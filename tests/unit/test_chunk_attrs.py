"""The in-process indexes' columnar attribute table (query_service.chunk_attrs): every slot reads exactly
the attributes its chunk was added with, before and after compactions, whatever the names (an open
set: metadata keys come and go) and the value types, and after a round trip through export/restore."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from query_service.chunk_attrs import ChunkAttrsTable, HeldFilter, decode_value, encode_value
from ragrpc.models import StageScores
from ragrpc.store import schema as s
from ragrpc.store.request_filter import filter_from_request

NAMES = [s.COLLECTION, s.SOURCE, s.TAGS, s.DOC_DATE, s.KIND, s.PAGE_START, s.METADATA, "meta_department", "meta_year"]
values = st.one_of(
    st.integers(-5, 5),
    st.integers(2**62, 2**63 - 1),
    st.integers(2**63, 2**64),  # past int64: the column becomes coded
    st.sampled_from(["", "a", "b", "ü"]),
    st.tuples(st.sampled_from(["x", "y"])),
    st.fixed_dictionaries({"organization": st.sampled_from(["A", "B"])}),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
)
chunk_attrs = st.dictionaries(st.sampled_from(NAMES), values, max_size=len(NAMES))
batches = st.lists(st.lists(chunk_attrs, min_size=0, max_size=6), min_size=1, max_size=8)


def _same(got: dict[str, Any], want: dict[str, Any]) -> bool:
    """Equal, with the types too (1 is not True, 1.0 is not 1)."""
    return got == want and all(type(got[k]) is type(want[k]) for k in want)


@given(batches, st.lists(st.booleans(), min_size=8, max_size=8), st.data())
@settings(max_examples=300, deadline=None)
def test_each_slot_reads_what_its_chunk_was_added_with_through_compactions(batches, compact_after, data) -> None:
    table = ChunkAttrsTable()
    expected: list[dict[str, Any]] = []
    for batch, compact in zip(batches, compact_after, strict=False):
        table.append_document(batch)
        expected += [dict(attrs) for attrs in batch]
        if compact:  # drop some slots, fold the rest into numpy columns
            kept = sorted(data.draw(st.sets(st.integers(0, max(0, len(expected) - 1)))) & set(range(len(expected))))
            table = table.merged(np.asarray(kept, dtype=np.int64))
            expected = [expected[i] for i in kept]
        assert len(table) == len(expected)
        for slot, want in enumerate(expected):
            view = table.view(slot)
            assert _same(dict(view), want) and len(view) == len(want)
            assert all(view.get(name, "missing") == want.get(name, "missing") for name in NAMES)
    compacted = table.merged(np.arange(len(expected)))
    meta, arrays = compacted.export()
    restored = ChunkAttrsTable.restore(meta, arrays)
    assert [dict(restored.view(i)) for i in range(len(expected))] == expected


def test_a_value_one_chunk_lacks_reads_as_absent_and_skipped_names_are_not_kept() -> None:
    table = ChunkAttrsTable()
    table.append_document([{s.SOURCE: "a.pdf", s.PAGE_START: 1, s.TENANT: "t"}, {s.SOURCE: "a.pdf"}], skip={s.TENANT})
    second = table.view(1)
    assert s.PAGE_START not in second and second.get(s.PAGE_START, -1) == -1
    assert dict(second) == {s.SOURCE: "a.pdf"} and dict(table.view(0)) == {s.SOURCE: "a.pdf", s.PAGE_START: 1}
    with pytest.raises(KeyError):
        second[s.PAGE_START]


def test_compaction_keeps_ints_as_narrow_ints_and_strings_once() -> None:
    table = ChunkAttrsTable()
    for d in range(2000):
        table.append_document([{s.COLLECTION: "papers", s.SOURCE: f"/d/{d}.pdf", s.PAGE_START: p} for p in range(5)])
    merged = table.merged(np.arange(len(table)))
    columns = merged._columns  # noqa: SLF001 - the layout is what is checked
    assert columns[s.PAGE_START].values.dtype == np.int8 and columns[s.PAGE_START].present is None
    assert len(columns[s.COLLECTION].table) == 1 and columns[s.COLLECTION].codes.dtype == np.int32
    assert len(columns[s.SOURCE].table) == 2000
    assert merged.nbytes < 10_000 * 16  # 5 bytes of codes and pages a chunk, and the 2,000 sources once
    again = merged.merged(np.arange(0, len(merged), 2))  # dropped documents' values go with them
    assert len(again._columns[s.SOURCE].table) == 2000  # noqa: SLF001 - every document keeps some chunk
    assert len(merged.merged(np.arange(0, 5))._columns[s.SOURCE].table) == 1  # noqa: SLF001


def test_a_recent_value_equal_to_a_compact_one_shares_its_entry() -> None:
    table = ChunkAttrsTable()
    table.append_document([{s.COLLECTION: "papers", s.TAGS: ("a", "b")}])
    table = table.merged(np.arange(1))
    table.append_document([{s.COLLECTION: "papers", s.TAGS: ("a", "b")}, {s.COLLECTION: "notes"}])
    merged = table.merged(np.arange(3))
    assert len(merged._columns[s.COLLECTION].table) == 2 and len(merged._columns[s.TAGS].table) == 1  # noqa: SLF001
    assert [merged.view(i).get(s.COLLECTION) for i in range(3)] == ["papers", "papers", "notes"]


def test_values_keep_their_type_and_unsupported_ones_are_refused_with_the_name() -> None:
    for value in ["x", 7, 2**70, 1.5, True, None, ("a", "b"), {"k": "v", "n": [1, 2]}, frozenset({"a", "b"})]:
        decoded = decode_value(encode_value(value))
        assert decoded == (value if not isinstance(value, dict) else {"k": "v", "n": (1, 2)})
        assert type(decoded) is type(value)
    assert decode_value(encode_value(["a", ["b"]])) == ("a", ("b",))  # lists read back as tuples
    table = ChunkAttrsTable()
    with pytest.raises(TypeError, match="'meta_when'"):
        table.append_document([{"meta_when": object()}])
    with pytest.raises(TypeError, match="'metadata'"):
        table.append_document([{s.METADATA: {1: "a"}}])


def test_a_dict_value_is_a_fresh_copy_for_each_reader() -> None:
    table = ChunkAttrsTable()
    table.append_document([{s.METADATA: {"organization": "Acme"}}])
    first = table.view(0)[s.METADATA]
    first["organization"] = "changed"
    assert table.view(0)[s.METADATA] == {"organization": "Acme"}
    merged = table.merged(np.arange(1))
    merged.view(0)[s.METADATA]["organization"] = "changed"
    assert merged.view(0)[s.METADATA] == {"organization": "Acme"}


def test_held_filter_keeps_the_hit_fields_of_what_passed() -> None:
    table = ChunkAttrsTable()
    row = {s.TENANT: "t", s.COLLECTION: "c", s.DOCUMENT_ID: "d", s.GENERATION: "g", s.CHUNK_INDEX: 3}
    row |= {s.CHUNKER: "recursive", s.KIND: 0, s.CHUNK_ID: "d-3", s.TAGS: ("x",)}
    table.append_document([row, {**row, s.CHUNK_ID: "d-4", s.TAGS: ("y",)}])
    held = HeldFilter(filter_from_request("t", "c", tags=["x"]))
    assert held(table.view(0)) and not held(table.view(1))
    [hit] = held.hits([("d-3", 2.5)], lambda score: StageScores(sparse=score))
    assert (hit.chunk.chunk_id, hit.chunk.document_id, hit.chunk.chunk_index, hit.score) == ("d-3", "d", 3, 2.5)
    assert hit.scores.sparse == 2.5 and not hit.complete


def test_a_slots_hit_read_from_its_identity_and_columns_equals_the_hit_of_its_attributes() -> None:
    from query_service.slot_table import SlotTable
    from ragrpc.store.milvus_chunks import hit_to_chunk

    slots = SlotTable("t")
    row = {s.COLLECTION: "c", s.GENERATION: "g1", s.CHUNK_INDEX: 0, s.CHUNKER: "recursive", s.KIND: 1}
    slots.append("d1", ["d1-0", "d1-1"], [row, {**row, s.CHUNK_INDEX: 1, s.KIND: 0}])
    slots.append("d2", ["d2-0"], [{**row, s.GENERATION: "g2"}])
    for compacted in (False, True):
        table = slots.merged(slots.live()) if compacted else slots
        for slot in range(3):
            view = table.view(slot)
            assert view.hit() == hit_to_chunk(view)
        assert [table.view(slot).hit().chunk_id for slot in range(3)] == ["d1-0", "d1-1", "d2-0"]
        assert table.view(2).hit().document_id == "d2" and table.view(1).hit().chunk_index == 1
    slots.append("d3", ["d3-0"], [{s.COLLECTION: "c"}])  # a chunk without the hit fields: the same KeyError
    with pytest.raises(KeyError):
        hit_to_chunk(slots.view(3))
    with pytest.raises(KeyError):
        slots.view(3).hit()
