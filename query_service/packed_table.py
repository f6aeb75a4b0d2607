"""Per-document state the query service keeps for every document, packed: document key -> one
`bytes` object per document instead of a tree of Python objects.

The registry follower's view (every visible document's generation, chunk count and chunk fields)
and ChunkIndexSync's record of what its indexes hold have one entry per document: at a million
documents, a dict of frozen dataclasses holding their own strings and tuples cost about 1.2 GB of
the query service's private memory, most of its RSS after a start from an index snapshot
(docs/benchmarks.md). Packed, an entry is its key, a dict slot and one bytes object (about 150 B).
A `PackedCodec` turns a value into its bytes and back; the value's first field, its generation, is
stored first behind a two-byte length, so the visibility check of a query (a generation per hit)
reads it without unpacking the rest.

A table is written to an index snapshot as two ragged arrays (keys, packed values) and restored
from them straight into the dict, with no intermediate objects (a JSON document of a million rows
took 0.9 GB to parse, and the heap it fragmented was not given back).

Thread safety: as a dict. The owner changes a table under its own lock; readers on other threads
read single entries without one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, Protocol, TypeVar

import numpy as np

from query_service.ragged_arrays import StringTable, nest_arrays, sub_arrays

V = TypeVar("V")

_LENGTH = 2  # bytes of the generation's length prefix
_MAX_GENERATION = 2 ** (8 * _LENGTH) - 1


class PackedCodec(Protocol[V]):
    def pack(self, value: V) -> tuple[str, bytes]:
        """The value's generation and the rest of it as bytes."""
        ...

    def unpack(self, key: str, generation: str, rest: bytes) -> V:
        """The value stored under `key` (the inverse of `pack`)."""
        ...


def _pack(generation: str, rest: bytes) -> bytes:
    head = generation.encode()
    if len(head) > _MAX_GENERATION:
        raise ValueError(f"a generation of {len(head)} bytes is longer than {_MAX_GENERATION}")
    return len(head).to_bytes(_LENGTH, "little") + head + rest


def _generation(data: bytes) -> str:  # on the query path (a visibility check per hit): no slice for the length
    return data[_LENGTH : _LENGTH + (data[0] | data[1] << 8)].decode()


def _split(data: bytes) -> tuple[str, bytes]:
    end = _LENGTH + (data[0] | data[1] << 8)
    return data[_LENGTH:end].decode(), data[end:]


class PackedTable(Generic[V]):
    """A mapping of document keys to values kept packed (see the module docstring)."""

    __slots__ = ("_codec", "_rows")

    def __init__(self, codec: PackedCodec[V], rows: dict[str, bytes] | None = None) -> None:
        self._codec = codec
        self._rows: dict[str, bytes] = rows if rows is not None else {}

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, key: object) -> bool:
        return key in self._rows

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def keys(self) -> list[str]:
        return list(self._rows)

    def get(self, key: str) -> V | None:
        data = self._rows.get(key)
        if data is None:
            return None
        generation, rest = _split(data)
        return self._codec.unpack(key, generation, rest)

    def generation(self, key: str) -> str | None:
        """The stored value's generation, without unpacking the rest."""
        data = self._rows.get(key)
        return _generation(data) if data is not None else None

    def generations_of(self, keys: Iterable[str]) -> dict[str, str]:
        """The stored generation of each of `keys` that is stored (a query's visibility check: one
        loop over the rows, no method call per key)."""
        rows = self._rows
        found: dict[str, str] = {}
        for key in keys:
            data = rows.get(key)
            if data is not None:
                found[key] = _generation(data)
        return found

    def __setitem__(self, key: str, value: V) -> None:
        self._rows[key] = _pack(*self._codec.pack(value))

    def pop(self, key: str) -> None:
        self._rows.pop(key, None)

    def update(self, other: PackedTable[V]) -> None:
        """Every entry of `other` (of the same codec), copied packed."""
        if other._codec is not self._codec:
            raise ValueError("tables of different codecs")
        if not self._rows:
            self._rows = dict(other._rows)
        else:
            self._rows.update(other._rows)

    def items(self) -> Iterator[tuple[str, V]]:
        """Every entry unpacked (over a copy of the keys: the table may change meanwhile)."""
        for key in list(self._rows):
            value = self.get(key)
            if value is not None:
                yield key, value

    def values(self) -> Iterator[V]:
        return (value for _, value in self.items())

    def generations(self) -> dict[str, str]:
        """Every key's generation."""
        return {key: _generation(data) for key, data in list(self._rows.items())}

    def copy(self) -> PackedTable[V]:
        return PackedTable(self._codec, dict(self._rows))

    def nbytes(self) -> int:
        """The bytes of the packed values and keys (not the dict's own slots)."""
        return sum(len(key) + len(data) for key, data in self._rows.items())

    # ---- snapshots -----------------------------------------------------------------------------------

    def export(self) -> dict[str, np.ndarray]:
        """The table as arrays (keys and packed values, each a ragged array), for a snapshot."""
        keys = StringTable.of_strings(self._rows.keys(), lookup=False)
        values = StringTable.build(list(self._rows.values()), lookup=False)
        return {**nest_arrays("keys", keys.export()), **nest_arrays("values", values.export())}

    @classmethod
    def restore(
        cls, codec: PackedCodec[V], arrays: Mapping[str, np.ndarray], *, share_keys_with: PackedTable | None = None
    ) -> PackedTable[V]:
        """A table from `export`'s arrays (ValueError when they do not fit together). Copies them
        into the table's own objects: the arrays may be released afterwards. `share_keys_with`: a
        table of (mostly) the same keys, whose key strings this one uses too (one string a document
        for both, 70 B a document less)."""
        keys = StringTable.restore(sub_arrays(arrays, "keys"))
        values = StringTable.restore(sub_arrays(arrays, "values"))
        if len(keys) != len(values):
            raise ValueError(f"a packed table of {len(keys)} keys and {len(values)} values")
        key_blob, value_blob = keys.blob.tobytes(), values.blob.tobytes()
        key_ends, value_ends = keys.offsets.tolist(), values.offsets.tolist()
        rows: dict[str, bytes] = {}
        known = {key: key for key in share_keys_with._rows} if share_keys_with is not None else {}
        for row in range(len(keys)):
            value = value_blob[value_ends[row] : value_ends[row + 1]]
            if len(value) < _LENGTH or _LENGTH + int.from_bytes(value[:_LENGTH], "little") > len(value):
                raise ValueError(f"packed value {row} is cut short")
            key = key_blob[key_ends[row] : key_ends[row + 1]].decode()
            rows[known.get(key, key)] = value
        if len(rows) != len(keys):
            raise ValueError("a packed table with a key twice")
        return cls(codec, rows)
