"""The in-process indexes' per-document attribute table (query_service.chunk_attrs): every slot reads
exactly the attributes its chunk was added with, whatever its document's chunks share or not."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from query_service.chunk_attrs import ChunkAttrsTable
from ragrpc.store import schema as s

NAMES = [s.COLLECTION, s.SOURCE, s.TAGS, s.DOC_DATE, s.KIND, s.CHUNK_INDEX, s.PAGE_START, s.METADATA, s.TENANT]
values = st.one_of(
    st.integers(-5, 5),
    st.sampled_from(["", "a", "b"]),
    st.tuples(st.sampled_from(["x", "y"])),
    st.fixed_dictionaries({"organization": st.sampled_from(["A", "B"])}),
)
chunk_attrs = st.dictionaries(st.sampled_from(NAMES), values, max_size=len(NAMES))
documents = st.lists(st.lists(chunk_attrs, min_size=0, max_size=6), min_size=1, max_size=6)


def _expected(attrs: dict[str, Any], fixed: dict[str, Any], chunk_id: str) -> dict[str, Any]:
    return {**attrs, **fixed, s.CHUNK_ID: chunk_id}


@given(documents, st.booleans(), st.data())
@settings(max_examples=300)
def test_each_slot_reads_what_its_chunk_was_added_with(docs: list[list[dict]], with_fixed: bool, data) -> None:
    table = ChunkAttrsTable()
    expected: list[dict[str, Any]] = []
    for d, chunks in enumerate(docs):
        fixed = {s.TENANT: "t", s.DOCUMENT_ID: f"d{d}"} if with_fixed else {}
        table.append_document(chunks, **fixed)
        expected += [_expected(attrs, fixed, f"c{len(expected) + i}") for i, attrs in enumerate(chunks)]
    assert len(table) == len(expected)
    for slot, want in enumerate(expected):
        view = table.view(slot, want[s.CHUNK_ID])
        assert dict(view) == want and len(view) == len(want)
        assert all(view.get(name, "missing") == want.get(name, "missing") for name in [*NAMES, s.DOCUMENT_ID])

    kept = sorted(data.draw(st.sets(st.integers(0, max(0, len(expected) - 1)))) & set(range(len(expected))))
    table.keep(kept)
    assert [dict(table.view(i, expected[slot][s.CHUNK_ID])) for i, slot in enumerate(kept)] == [
        expected[slot] for slot in kept
    ]


def test_a_value_one_chunk_lacks_reads_as_absent() -> None:
    table = ChunkAttrsTable()
    table.append_document([{s.SOURCE: "a.pdf", s.PAGE_START: 1}, {s.SOURCE: "a.pdf"}], **{s.TENANT: "t"})
    second = table.view(1, "c1")
    assert s.PAGE_START not in second and second.get(s.PAGE_START, -1) == -1
    assert dict(second) == {s.SOURCE: "a.pdf", s.TENANT: "t", s.CHUNK_ID: "c1"}
    assert table.view(0, "c0")[s.PAGE_START] == 1
