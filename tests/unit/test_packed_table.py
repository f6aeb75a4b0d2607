"""The packed per-document tables of the query service (query_service.packed_table): the follower's
view and the sync's record of its indexes, their snapshot form, and restores of arrays that do not
fit."""

from __future__ import annotations

import numpy as np
import pytest

from query_service.index_sync import APPLIED_CODEC
from query_service.packed_table import PackedTable
from query_service.ragged_arrays import StringTable, nest_arrays
from query_service.registry_follower import VIEW_CODEC, DocumentView


def _view(document_id: str, generation: str = "g1", **fields: object) -> DocumentView:
    title = str(fields.get("title", "a title"))
    tags = tuple(fields.get("tags", ("x", "y")))  # type: ignore[arg-type]
    metadata = tuple(fields.get("metadata", (("lang", "en"), ("year", "2021"))))  # type: ignore[arg-type]
    return DocumentView("tenant-1", document_id, generation, (title, tags, metadata), int(fields.get("count", 3)))  # type: ignore[call-overload]


def test_a_view_comes_back_as_it_was_stored_with_its_generation_readable_alone() -> None:
    table: PackedTable[DocumentView] = PackedTable(VIEW_CODEC)
    views = [
        _view("plain"),
        _view("doc.2:v-1_x", generation="18f3a-9c1d2e3f", title="Zürich — 東京 \x00 nul", tags=("é", ""), count=0),
        _view("empty", generation="", title="", tags=(), metadata=()),
        _view("json-like", title='{"a": [1, 2]}', metadata=(("k", '"quoted"\n'),), count=2**31 - 1),
    ]
    for view in views:
        table[view.key] = view
    for view in views:
        assert table.get(view.key) == view
        assert table.generation(view.key) == view.generation
    assert table.get("tenant-1/absent") is None and table.generation("tenant-1/absent") is None
    assert len(table) == 4 and views[0].key in table
    assert dict(table.items()) == {v.key: v for v in views}
    assert table.generations() == {v.key: v.generation for v in views}
    asked = [views[1].key, "tenant-1/absent", views[2].key, views[1].key]
    assert table.generations_of(asked) == {views[1].key: views[1].generation, views[2].key: ""}
    assert table.generations_of([]) == {}
    table.pop(views[0].key)
    table.pop("tenant-1/absent")  # absent: nothing to do
    assert views[0].key not in table and len(table) == 3


def test_replacing_an_entry_keeps_one_entry_with_the_new_value() -> None:
    table: PackedTable[tuple[str, int]] = PackedTable(APPLIED_CODEC)
    table["t/a"] = ("g1", 5)
    table["t/a"] = ("g2", 70_000)
    assert table.get("t/a") == ("g2", 70_000) and len(table) == 1


def test_the_snapshot_form_restores_an_equal_table_of_any_size() -> None:
    table: PackedTable[DocumentView] = PackedTable(VIEW_CODEC)
    for i in range(5_000):
        table[f"tenant-1/doc-{i}"] = _view(f"doc-{i}", generation=f"g{i % 7}", title=f"title {i} ✓", count=i)
    arrays = table.export()
    assert set(arrays) == {"keys/blob", "keys/offsets", "values/blob", "values/offsets"}
    restored = PackedTable.restore(VIEW_CODEC, arrays)
    assert dict(restored.items()) == dict(table.items())
    empty = PackedTable.restore(VIEW_CODEC, PackedTable(VIEW_CODEC).export())
    assert len(empty) == 0


def test_arrays_that_do_not_fit_are_refused_with_a_value_error() -> None:
    table: PackedTable[tuple[str, int]] = PackedTable(APPLIED_CODEC)
    table["t/a"], table["t/b"] = ("g1", 1), ("g2", 2)
    arrays = table.export()

    fewer_values = {**arrays, **nest_arrays("values", StringTable.build([b"\x02\x00g1"], lookup=False).export())}
    with pytest.raises(ValueError, match="2 keys and 1 values"):
        PackedTable.restore(APPLIED_CODEC, fewer_values)

    cut_short = {**arrays, **nest_arrays("values", StringTable.build([b"\x09\x00g1", b"\x02"], lookup=False).export())}
    with pytest.raises(ValueError, match="cut short"):
        PackedTable.restore(APPLIED_CODEC, cut_short)

    twice = {**arrays, **nest_arrays("keys", StringTable.of_strings(["t/a", "t/a"], lookup=False).export())}
    with pytest.raises(ValueError, match="key twice"):
        PackedTable.restore(APPLIED_CODEC, twice)

    torn = dict(arrays)
    torn["keys/offsets"] = np.array([0, 3, 99], dtype=np.int64)
    with pytest.raises(ValueError, match="do not span"):
        PackedTable.restore(APPLIED_CODEC, torn)

    not_utf8 = {**arrays, **nest_arrays("keys", StringTable.build([b"t/a", b"\xff\xfe"], lookup=False).export())}
    with pytest.raises(ValueError):
        PackedTable.restore(APPLIED_CODEC, not_utf8)


def test_update_copies_entries_of_the_same_codec_only() -> None:
    first: PackedTable[tuple[str, int]] = PackedTable(APPLIED_CODEC)
    second: PackedTable[tuple[str, int]] = PackedTable(APPLIED_CODEC)
    first["t/a"], second["t/b"] = ("g1", 1), ("g2", 2)
    first.update(second)
    assert dict(first.items()) == {"t/a": ("g1", 1), "t/b": ("g2", 2)}
    with pytest.raises(ValueError, match="different codecs"):
        first.update(PackedTable(VIEW_CODEC))  # type: ignore[arg-type]


def test_a_generation_longer_than_the_length_prefix_is_refused() -> None:
    table: PackedTable[tuple[str, int]] = PackedTable(APPLIED_CODEC)
    with pytest.raises(ValueError, match="longer than 65535"):
        table["t/a"] = ("g" * 70_000, 1)


def test_a_table_restored_beside_another_shares_its_key_strings() -> None:
    views: PackedTable[DocumentView] = PackedTable(VIEW_CODEC)
    applied: PackedTable[tuple[str, int]] = PackedTable(APPLIED_CODEC)
    for i in range(100):
        views[f"tenant-1/doc-{i}"] = _view(f"doc-{i}")
        applied[f"tenant-1/doc-{99 - i}"] = ("g1", i)  # another order
    applied["tenant-1/only-here"] = ("g2", 1)
    view_table = PackedTable.restore(VIEW_CODEC, views.export())
    applied_table = PackedTable.restore(APPLIED_CODEC, applied.export(), share_keys_with=view_table)
    assert dict(applied_table.items()) == dict(applied.items())
    view_keys = {key: key for key in view_table}
    shared = [key for key in applied_table if key in view_keys and view_keys[key] is key]
    assert len(shared) == 100
