"""The filterable attributes of the chunks an in-process index holds (BM25, `sparse_index`; vectors,
`dense_index`), in columns, and the request filter that reads them (`HeldFilter`).

Both indexes test a request's filter against each candidate's attributes (collection, source, tags,
dates, kind, pages, each declared metadata key, ...). The set of names is open: a column is made for
each name the chunks bring. Columns are numpy arrays, one value per slot of the index:

  * int attributes (dates, pages, kind, chunk index, an int metadata key) keep the ints themselves,
    in the narrowest int type that holds the column (1-8 bytes a chunk), with a presence mask only
    where some chunk lacks the attribute;
  * every other value (strings, tag tuples, a dict of facts, floats, ...) is stored once in the
    column's `StringTable` (encoded: a string as its UTF-8 bytes, the rest as JSON) and each slot
    holds a 4-byte code, so a value its document's chunks (or all chunks: collection, media type)
    repeat costs 4 bytes a chunk.

New slots go to a small appendable part (array.array columns, a dict per column that shares equal
values); a compaction (`merged`) folds it into new numpy columns, dropping what no kept slot uses.
The numpy columns are what an index snapshot writes and memory-maps back (`export` / `restore`).

A filter reads a chunk through `ChunkAttrs`, a read-only Mapping over one slot (values decoded on
access). Values read back as they were given, except that lists read back as tuples.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from query_service.ragged_arrays import StringTable, nest_arrays, sub_arrays
from ragrpc.models import ChunkKind, ChunkRecord, ScoredChunk, StageScores
from ragrpc.store import schema
from ragrpc.store.filters import FilterExpr
from ragrpc.store.milvus_chunks import hit_to_chunk

_ABSENT: Any = object()
_IDENTITY_NAMES = frozenset((schema.CHUNK_ID, schema.DOCUMENT_ID, schema.TENANT))
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_DECODED_CACHE_LIMIT = 65536  # decoded values a column keeps (a filter reads the same few again and again)
_INT_TYPES = (np.int8, np.int16, np.int32, np.int64)


# --- values ---------------------------------------------------------------------------


def encode_value(value: Any, name: str = "") -> bytes:
    """A value's bytes in a column's table: a str's UTF-8 after b"s", anything else as JSON after b"j"
    (tuples and lists as JSON arrays, read back as tuples), a frozenset as a sorted array after b"f".
    TypeError for a value JSON cannot hold exactly."""
    if type(value) is str:
        return b"s" + value.encode()
    if isinstance(value, frozenset):
        return b"f" + _json(sorted(_plain(v, name) for v in value))
    return b"j" + _json(_plain(value, name))


def decode_value(data: bytes) -> Any:
    tag, body = data[:1], data[1:]
    if tag == b"s":
        return body.decode()
    if tag == b"f":
        return frozenset(_tupled(v) for v in json.loads(body))
    return _tupled(json.loads(body))


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _plain(value: Any, name: str) -> Any:
    """`value` as JSON types (checking every part), or TypeError naming the attribute."""
    if value is None or isinstance(value, str | bool | float):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, tuple | list):
        return [_plain(v, name) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _plain(v, name) for k, v in value.items()}
    raise TypeError(
        f"attribute {name!r} has a value of type {type(value).__name__}; an index holds str, int, float, bool, "
        "None, tuples and lists, frozensets and dicts with str keys of those"
    )


def _tupled(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tupled(v) for v in value)
    if isinstance(value, dict):
        return {k: _tupled(v) for k, v in value.items()}
    return value


def _is_int64(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and _INT64_MIN <= value <= _INT64_MAX


def _narrowest_int(values: np.ndarray) -> np.ndarray:
    if not len(values):
        return values.astype(np.int8)
    low, high = int(values.min()), int(values.max())
    for kind in _INT_TYPES:
        info = np.iinfo(kind)
        if info.min <= low and high <= info.max:
            return values.astype(kind)
    return values  # pragma: no cover - int64 holds every value an int column takes


# --- compact columns (numpy; what a snapshot holds) ------------------------------------


class _IntColumn:
    """Ints, one a slot; `present` is None when every slot has the attribute."""

    __slots__ = ("values", "present")

    def __init__(self, values: np.ndarray, present: np.ndarray | None) -> None:
        self.values = values
        self.present = present

    def get(self, slot: int, default: Any) -> Any:
        present = self.present
        if present is not None and not present[slot]:
            return default
        return int(self.values[slot])

    def has(self, slot: int) -> bool:
        return self.present is None or bool(self.present[slot])


class _CodedColumn:
    """A code a slot (-1: absent) into `table`, the column's distinct values, encoded."""

    __slots__ = ("codes", "table", "_decoded")

    def __init__(self, codes: np.ndarray, table: StringTable) -> None:
        self.codes = codes
        self.table = table
        self._decoded: dict[int, Any] = {}

    def get(self, slot: int, default: Any) -> Any:
        code = int(self.codes[slot])
        if code < 0:
            return default
        value = self._decoded.get(code, _ABSENT)
        if value is _ABSENT:
            value = decode_value(self.table.bytes_at(code))
            if isinstance(value, dict):
                return value  # a fresh dict for each reader: never one shared mutable value
            if len(self._decoded) >= _DECODED_CACHE_LIMIT:
                self._decoded.clear()
            self._decoded[code] = value
        return value

    def has(self, slot: int) -> bool:
        return int(self.codes[slot]) >= 0


_Column = _IntColumn | _CodedColumn


# --- the appendable part (recent slots) ------------------------------------------------


class _RecentColumn:
    """A column of the slots added since the last compaction: ints in an array('q') while every value
    is an int64, else codes into the column's own list of distinct values."""

    __slots__ = ("ints", "present", "codes", "values", "encoded", "index")

    def __init__(self, rows: int) -> None:
        self.ints: array | None = array("q", bytes(8 * rows))
        self.present = bytearray(rows)
        self.codes: array | None = None
        self.values: list[Any] = []
        self.encoded: list[bytes] = []
        self.index: dict[Any, int] = {}

    def append(self, value: Any, name: str) -> None:
        if self.ints is not None:
            if value is _ABSENT:
                self.ints.append(0)
                self.present.append(0)
                return
            if _is_int64(value):
                self.ints.append(int(value))
                self.present.append(1)
                return
            self._to_codes(name)
        assert self.codes is not None
        self.codes.append(-1 if value is _ABSENT else self._code(value, name))

    def _code(self, value: Any, name: str) -> int:
        # the key that finds an equal value again: a str itself (never equal to a key of another kind),
        # None, an int or a bool with its type (True == 1, yet they are different values), else its bytes
        kind = type(value)
        scalar = kind is str or value is None or kind is int or kind is bool
        encoded = b""
        if kind is str:
            key: Any = value
        elif scalar:
            key = (kind, value)
        else:
            key = encoded = encode_value(value, name)
        code = self.index.get(key)
        if code is None:
            code = self.index[key] = len(self.values)
            self.values.append(value if scalar else decode_value(encoded))
            self.encoded.append(encoded or encode_value(value, name))
        return code

    def _to_codes(self, name: str) -> None:
        """The column met a value that is not an int64: its ints become coded values."""
        ints, present = self.ints, self.present
        assert ints is not None
        self.ints = None
        self.codes = array("i")
        for value, has in zip(ints, present, strict=True):
            self.codes.append(self._code(value, name) if has else -1)

    def get(self, row: int, default: Any) -> Any:
        if self.ints is not None:
            return self.ints[row] if self.present[row] else default
        assert self.codes is not None
        code = self.codes[row]
        if code < 0:
            return default
        value = self.values[code]
        return dict(value) if isinstance(value, dict) else value

    def has(self, row: int) -> bool:
        if self.ints is not None:
            return bool(self.present[row])
        assert self.codes is not None
        return self.codes[row] >= 0


# --- the table -------------------------------------------------------------------------


class SlotIdentity(Protocol):
    """What an index knows of a slot itself (chunk id, document id, tenant), read by a `ChunkAttrs`
    under those names whatever the attributes say."""

    identity_names: frozenset[str]

    def identity_value(self, name: str, slot: int) -> Any: ...


class ChunkAttrsTable:
    """The attributes of an index's slots, appended a document at a time in slot order."""

    def __init__(self, columns: Mapping[str, _Column] | None = None, size: int = 0) -> None:
        self._columns: dict[str, _Column] = dict(columns or {})  # the compact slots 0..size-1
        self._compact_size = size
        self._recent: dict[str, _RecentColumn] = {}  # slots size.. (appended)
        self._recent_size = 0

    def __len__(self) -> int:
        return self._compact_size + self._recent_size

    @property
    def recent_size(self) -> int:
        return self._recent_size

    def append_document(self, attrs: Sequence[Mapping[str, Any]], skip: frozenset[str] = frozenset()) -> None:
        """One slot per mapping, in order; names in `skip` are not kept (the index's own: chunk id, ...)."""
        recent = self._recent
        for chunk in attrs:
            for name in chunk:
                if name not in recent and name not in skip:
                    recent[name] = _RecentColumn(self._recent_size)
            for name, column in recent.items():
                column.append(chunk.get(name, _ABSENT), name)
            self._recent_size += 1

    def get(self, slot: int, name: str, default: Any = None) -> Any:
        if slot < self._compact_size:
            column = self._columns.get(name)
            return default if column is None else column.get(slot, default)
        recent = self._recent.get(name)
        return default if recent is None else recent.get(slot - self._compact_size, default)

    def names(self, slot: int) -> Iterator[str]:
        """The names the slot has a value of."""
        if slot < self._compact_size:
            return (name for name, column in self._columns.items() if column.has(slot))
        row = slot - self._compact_size
        return (name for name, column in self._recent.items() if column.has(row))

    def view(self, slot: int, identity: SlotIdentity | None = None) -> ChunkAttrs:
        return ChunkAttrs(self, slot, identity)

    # --- compaction ------------------------------------------------------------------
    def merged(self, keep: np.ndarray) -> ChunkAttrsTable:
        """A new table of only the slots `keep` (ascending), renumbered 0.. in that order, all compact.
        This table is left as it was (readers may still be using it)."""
        keep = np.asarray(keep, dtype=np.int64)
        keep_compact = keep[keep < self._compact_size]
        keep_recent = keep[keep >= self._compact_size] - self._compact_size
        columns: dict[str, _Column] = {}
        for name in dict.fromkeys([*self._columns, *self._recent]):
            compact, recent = self._columns.get(name), self._recent.get(name)
            if _all_ints(compact, recent):
                column: _Column | None = _merged_ints(compact, recent, keep_compact, keep_recent)
            else:
                column = _merged_codes(compact, recent, keep_compact, keep_recent, name)
            if column is not None:
                columns[name] = column
        return ChunkAttrsTable(columns, len(keep))

    # --- snapshot --------------------------------------------------------------------
    def export(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(meta, arrays) of a compacted table (no recent slots: compact first)."""
        if self._recent_size:
            raise ValueError("export of an attribute table with uncompacted slots")
        meta: dict[str, Any] = {"size": self._compact_size, "columns": []}
        arrays: dict[str, np.ndarray] = {}
        for number, (name, column) in enumerate(self._columns.items()):
            prefix = f"c{number}"
            if isinstance(column, _IntColumn):
                meta["columns"].append({"name": name, "kind": "int"})
                arrays[f"{prefix}/values"] = column.values
                if column.present is not None:
                    arrays[f"{prefix}/present"] = column.present
            else:
                meta["columns"].append({"name": name, "kind": "coded"})
                arrays[f"{prefix}/codes"] = column.codes
                arrays.update(nest_arrays(f"{prefix}/table", column.table.export()))
        return meta, arrays

    @classmethod
    def restore(cls, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> ChunkAttrsTable:
        size = int(meta["size"])
        columns: dict[str, _Column] = {}
        for number, spec in enumerate(meta["columns"]):
            prefix = f"c{number}"
            column: _Column
            if spec["kind"] == "int":
                values = arrays[f"{prefix}/values"]
                column, rows = _IntColumn(values, arrays.get(f"{prefix}/present")), len(values)
            else:
                codes = arrays[f"{prefix}/codes"]
                column, rows = (
                    _CodedColumn(codes, StringTable.restore(sub_arrays(arrays, f"{prefix}/table"))),
                    len(codes),
                )
            if rows != size:
                raise ValueError(f"attribute column {spec['name']!r} has {rows} rows, the table {size}")
            columns[str(spec["name"])] = column
        return cls(columns, size)

    @property
    def nbytes(self) -> int:
        """Bytes of the compact columns' arrays (the appendable part is not counted)."""
        total = 0
        for column in self._columns.values():
            if isinstance(column, _IntColumn):
                total += column.values.nbytes + (column.present.nbytes if column.present is not None else 0)
            else:
                total += column.codes.nbytes + column.table.nbytes
        return total


def _all_ints(compact: _Column | None, recent: _RecentColumn | None) -> bool:
    return (compact is None or isinstance(compact, _IntColumn)) and (recent is None or recent.ints is not None)


def _merged_ints(
    compact: _Column | None, recent: _RecentColumn | None, keep_compact: np.ndarray, keep_recent: np.ndarray
) -> _IntColumn | None:
    parts_values, parts_present = [], []
    if isinstance(compact, _IntColumn):
        parts_values.append(np.asarray(compact.values[keep_compact], dtype=np.int64))
        present = compact.present
        parts_present.append(np.ones(len(keep_compact), np.bool_) if present is None else present[keep_compact])
    else:
        parts_values.append(np.zeros(len(keep_compact), dtype=np.int64))
        parts_present.append(np.zeros(len(keep_compact), dtype=np.bool_))
    if recent is not None and recent.ints is not None:
        parts_values.append(np.array(recent.ints, dtype=np.int64)[keep_recent])
        parts_present.append(np.frombuffer(bytes(recent.present), dtype=np.bool_)[keep_recent])
    else:
        parts_values.append(np.zeros(len(keep_recent), dtype=np.int64))
        parts_present.append(np.zeros(len(keep_recent), dtype=np.bool_))
    values, present = np.concatenate(parts_values), np.concatenate(parts_present)
    if not present.any():
        return None
    return _IntColumn(_narrowest_int(np.where(present, values, 0)), None if present.all() else present)


def _coded_part(
    column: _Column | _RecentColumn | None, keep: np.ndarray, name: str
) -> tuple[np.ndarray, StringTable | Sequence[bytes]]:
    """The kept rows of one part of a column as (codes, -1 absent; the values the codes index)."""
    if column is None:
        return np.full(len(keep), -1, dtype=np.int64), []
    if isinstance(column, _CodedColumn):
        return np.asarray(column.codes[keep], dtype=np.int64), column.table
    if isinstance(column, _IntColumn):
        values, present = column.values[keep], column.present
        has = np.ones(len(keep), np.bool_) if present is None else present[keep]
    elif column.ints is not None:
        values = np.array(column.ints, dtype=np.int64)[keep]
        has = np.frombuffer(bytes(column.present), dtype=np.bool_)[keep]
    else:
        assert column.codes is not None
        return np.array(column.codes, dtype=np.int64)[keep], column.encoded
    distinct = np.unique(values[has])
    codes = np.where(has, np.searchsorted(distinct, values), -1)
    return codes, [encode_value(int(v), name) for v in distinct.tolist()]


def _merged_codes(
    compact: _Column | None, recent: _RecentColumn | None, keep_compact: np.ndarray, keep_recent: np.ndarray, name: str
) -> _CodedColumn | None:
    codes_c, values_c = _coded_part(compact, keep_compact, name)
    codes_r, values_r = _coded_part(recent, keep_recent, name)
    if not (codes_c >= 0).any() and not (codes_r >= 0).any():
        return None
    if not isinstance(values_c, StringTable):
        values_c = StringTable.build(values_c, lookup=True)
    assert not isinstance(values_r, StringTable), "a recent column's values are a list"
    used = np.unique(codes_c[codes_c >= 0])
    codes_c = np.where(codes_c >= 0, np.searchsorted(used, codes_c), -1)
    # the recent part's values: one already among the kept compact ones takes its code, the others are added
    used_recent = np.unique(codes_r[codes_r >= 0])
    encoded = [values_r[code] for code in used_recent.tolist()]
    rows = values_c.find_many(encoded) if len(values_c) and encoded else np.full(len(encoded), -1)
    positions = np.searchsorted(used, rows)
    reused = (rows >= 0) & (positions < len(used))
    reused[reused] = used[positions[reused]] == rows[reused]
    added = [item for item, again in zip(encoded, reused.tolist(), strict=True) if not again]
    new_codes = np.where(reused, positions, len(used) + np.cumsum(~reused) - 1)
    if len(used_recent):
        codes_r = np.where(codes_r >= 0, new_codes[np.searchsorted(used_recent, codes_r)], -1)
    table = StringTable.combine(values_c, used, added, lookup=True)
    codes = np.concatenate((codes_c, codes_r)).astype(np.int32)
    return _CodedColumn(codes, table)


# --- reading a slot ----------------------------------------------------------------------


class ChunkAttrs(Mapping[str, Any]):
    """One slot's attributes as filters read them (with the index's chunk id, document id, tenant)."""

    __slots__ = ("_table", "_slot", "_identity")

    def __init__(self, table: ChunkAttrsTable, slot: int, identity: SlotIdentity | None = None) -> None:
        self._table = table
        self._slot = slot
        self._identity = identity

    def get(self, name: str, default: Any = None) -> Any:
        identity = self._identity
        if identity is not None and name in identity.identity_names:
            return identity.identity_value(name, self._slot)
        return self._table.get(self._slot, name, default)

    def __getitem__(self, name: str) -> Any:
        value = self.get(name, _ABSENT)
        if value is _ABSENT:
            raise KeyError(name)
        return value

    def hit(self) -> ChunkRecord:
        """The slot as a search hit (schema.HIT_FIELDS), what `hit_to_chunk(self)` makes, read straight
        from the identity and the columns: a search makes one for each of its hits."""
        identity, table, slot = self._identity, self._table, self._slot
        if identity is None or not _IDENTITY_NAMES <= identity.identity_names:
            return hit_to_chunk(self)
        get = table.get
        collection, generation = get(slot, schema.COLLECTION, _ABSENT), get(slot, schema.GENERATION, _ABSENT)
        chunk_index, chunker = get(slot, schema.CHUNK_INDEX, _ABSENT), get(slot, schema.CHUNKER, _ABSENT)
        kind = get(slot, schema.KIND, _ABSENT)
        if _ABSENT in (collection, generation, chunk_index, chunker, kind):
            return hit_to_chunk(self)  # raises the KeyError of the attribute missing
        return ChunkRecord(
            chunk_id=identity.identity_value(schema.CHUNK_ID, slot),
            document_id=identity.identity_value(schema.DOCUMENT_ID, slot),
            tenant=identity.identity_value(schema.TENANT, slot),
            collection=collection,
            generation=generation,
            text="",
            vector=[],
            chunk_index=int(chunk_index),
            chunker=chunker,
            kind=ChunkKind(int(kind)),
        )

    def __iter__(self) -> Iterator[str]:
        identity = self._identity
        names = identity.identity_names if identity is not None else frozenset()
        yield from (name for name in self._table.names(self._slot) if name not in names)
        yield from sorted(names)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class HeldFilter:
    """A request's filter as an in-process index's `allow` predicate; it keeps the attributes of what it
    let through, so the hits are made without asking the store (the final hits' rows are read by the
    retrieval pipeline). A `ChunkAttrs` stays valid after the search (an index's tables are replaced by
    a compaction, never changed under a slot), so only the hits returned are read out."""

    def __init__(self, expr: FilterExpr) -> None:
        self._expr = expr
        self._passed: dict[str, Mapping[str, Any]] = {}

    def __call__(self, attrs: Mapping[str, Any]) -> bool:
        if self._expr.matches(attrs):
            self._passed[attrs[schema.CHUNK_ID]] = attrs
            return True
        return False

    def hits(self, found: list[tuple[str, float]], scores: Callable[[float], StageScores]) -> list[ScoredChunk]:
        """The hits of `found` ((chunk id, score) that passed), with the stage scores `scores` makes."""
        return [
            ScoredChunk(_hit(self._passed[chunk_id]), float(score), scores(float(score)), complete=False)
            for chunk_id, score in found
        ]


def _hit(attrs: Mapping[str, Any]) -> ChunkRecord:
    return attrs.hit() if isinstance(attrs, ChunkAttrs) else hit_to_chunk(attrs)
