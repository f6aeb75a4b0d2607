"""Ragged arrays: variable-length rows kept as one flat numpy array and the rows' offsets (CSR), the
form the in-process indexes keep their strings (chunk ids, document ids, BM25 terms, attribute
values) and the BM25 index's per-chunk term lists in.

Two flat arrays instead of a Python object per row: a 32-character chunk id costs 40 bytes (its
bytes and an 8-byte offset) where a `str` in a list costs 89, and the arrays can be written to a
snapshot and memory-mapped back without building any object (query_service.index_snapshot).

`StringTable` adds a lookup (string -> row) that is itself two arrays: each row's 64-bit hash
(blake2b, stable across processes, unlike Python's `hash`) in sorted order, and the row each
sorted hash belongs to; a lookup is one binary search and a byte comparison, so a table loaded
from a snapshot answers lookups without building a dict of its strings.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

_NO_ROWS = np.zeros(0, dtype=np.int64)


def string_hash(data: bytes) -> int:
    """A stable 64-bit hash of `data` (the same in every process and on every start)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def take_rows(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The flat values and offsets of `rows` (ascending row numbers) of a ragged array.

    Runs of consecutive rows are copied as one slice each, so keeping most rows of a large
    array (what a compaction does) costs a few memory copies, not an index array per value."""
    rows = np.asarray(rows, dtype=np.int64)
    lengths = offsets[rows + 1] - offsets[rows] if len(rows) else _NO_ROWS
    new_offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    out = np.empty(int(new_offsets[-1]), dtype=values.dtype)
    if not len(rows):
        return out, new_offsets
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    run_first = rows[np.concatenate(([0], breaks))]
    run_last = rows[np.concatenate((breaks - 1, [len(rows) - 1]))]
    starts, stops = offsets[run_first], offsets[run_last + 1]
    position = 0
    for start, stop in zip(starts.tolist(), stops.tolist(), strict=True):
        out[position : position + stop - start] = values[start:stop]
        position += stop - start
    return out, new_offsets


class StringTable:
    """An immutable table of byte strings (UTF-8 text or encoded values): row i is
    `blob[offsets[i]:offsets[i + 1]]`; with a lookup, `find` gives a string's row."""

    __slots__ = ("blob", "offsets", "sorted_hashes", "by_hash")

    def __init__(
        self,
        blob: np.ndarray,
        offsets: np.ndarray,
        sorted_hashes: np.ndarray | None = None,
        by_hash: np.ndarray | None = None,
    ) -> None:
        self.blob = blob
        self.offsets = offsets
        self.sorted_hashes = sorted_hashes
        self.by_hash = by_hash

    @classmethod
    def build(cls, items: Sequence[bytes], *, lookup: bool) -> StringTable:
        return cls.combine(None, _NO_ROWS, items, lookup=lookup)

    @classmethod
    def of_strings(cls, strings: Iterable[str], *, lookup: bool) -> StringTable:
        return cls.build([s.encode() for s in strings], lookup=lookup)

    @classmethod
    def combine(
        cls,
        kept: StringTable | None,
        rows: np.ndarray,
        added: Sequence[bytes],
        *,
        lookup: bool,
        added_hashes: Sequence[int] | None = None,
    ) -> StringTable:
        """A new table: `rows` (ascending) of `kept`, then `added`. Hashes of kept rows are reused."""
        if kept is not None and len(rows):
            kept_blob, kept_offsets = take_rows(kept.blob, kept.offsets, rows)
        else:
            kept_blob, kept_offsets = np.zeros(0, dtype=np.uint8), np.zeros(1, dtype=np.int64)
        added_lengths = np.fromiter((len(item) for item in added), dtype=np.int64, count=len(added))
        blob = np.concatenate((kept_blob, np.frombuffer(b"".join(added), dtype=np.uint8)))
        offsets = np.concatenate((kept_offsets, kept_offsets[-1] + np.cumsum(added_lengths)))
        if not lookup:
            return cls(blob, offsets)
        kept_hashes = kept.hashes()[rows] if kept is not None and len(rows) else np.zeros(0, dtype=np.uint64)
        if added_hashes is None:
            added_hashes = [string_hash(item) for item in added]
        hashes = np.concatenate((kept_hashes, np.asarray(added_hashes, dtype=np.uint64)))
        order = np.argsort(hashes, kind="stable")
        index_type = np.int32 if len(hashes) < 2**31 else np.int64
        return cls(blob, offsets, hashes[order], order.astype(index_type))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def bytes_at(self, row: int) -> bytes:
        offsets = self.offsets
        return self.blob[offsets[row] : offsets[row + 1]].tobytes()

    def __getitem__(self, row: int) -> str:
        return self.bytes_at(row).decode()

    def hashes(self) -> np.ndarray:
        """Each row's hash, in row order (needs the lookup)."""
        assert self.sorted_hashes is not None and self.by_hash is not None, "a table without a lookup"
        hashes = np.empty(len(self), dtype=np.uint64)
        hashes[self.by_hash] = self.sorted_hashes
        return hashes

    def find(self, item: bytes, item_hash: int | None = None) -> int:
        """The row holding `item`, or -1 (needs the lookup)."""
        sorted_hashes, by_hash = self.sorted_hashes, self.by_hash
        assert sorted_hashes is not None and by_hash is not None, "a table without a lookup"
        wanted = np.uint64(string_hash(item) if item_hash is None else item_hash)
        position = int(np.searchsorted(sorted_hashes, wanted))
        while position < len(sorted_hashes) and sorted_hashes[position] == wanted:
            row = int(by_hash[position])
            if self.bytes_at(row) == item:
                return row
            position += 1
        return -1

    def find_many(self, items: Sequence[bytes], item_hashes: Sequence[int] | None = None) -> np.ndarray:
        """`find` of each item (one binary search for all of them)."""
        sorted_hashes, by_hash = self.sorted_hashes, self.by_hash
        assert sorted_hashes is not None and by_hash is not None, "a table without a lookup"
        if item_hashes is None:
            item_hashes = [string_hash(item) for item in items]
        wanted = np.asarray(item_hashes, dtype=np.uint64)
        positions = np.searchsorted(sorted_hashes, wanted).tolist()
        found = np.full(len(items), -1, dtype=np.int64)
        size = len(sorted_hashes)
        for i, (item, position) in enumerate(zip(items, positions, strict=True)):
            while position < size and sorted_hashes[position] == wanted[i]:
                row = int(by_hash[position])
                if self.bytes_at(row) == item:
                    found[i] = row
                    break
                position += 1
        return found

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.blob, self.offsets, self.sorted_hashes, self.by_hash) if a is not None)

    def export(self) -> dict[str, np.ndarray]:
        arrays = {"blob": self.blob, "offsets": self.offsets}
        if self.sorted_hashes is not None and self.by_hash is not None:
            arrays.update(sorted_hashes=self.sorted_hashes, by_hash=self.by_hash)
        return arrays

    @classmethod
    def restore(cls, arrays: Mapping[str, np.ndarray]) -> StringTable:
        table = cls(arrays["blob"], arrays["offsets"], arrays.get("sorted_hashes"), arrays.get("by_hash"))
        table.check()
        return table

    def check(self) -> None:
        """Cheap consistency checks of restored arrays (sizes and ends, not every value): ValueError."""
        offsets = self.offsets
        if offsets.ndim != 1 or len(offsets) < 1 or int(offsets[0]) != 0 or int(offsets[-1]) != len(self.blob):
            raise ValueError("string table offsets do not span the blob")
        if (self.sorted_hashes is None) != (self.by_hash is None):
            raise ValueError("string table lookup is incomplete")
        if self.sorted_hashes is not None and self.by_hash is not None:
            if not len(self.sorted_hashes) == len(self.by_hash) == len(self):
                raise ValueError("string table lookup does not match its rows")


def sub_arrays(arrays: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The entries of `arrays` under `prefix/`, with the prefix taken off (a nested export)."""
    start = prefix + "/"
    return {name[len(start) :]: value for name, value in arrays.items() if name.startswith(start)}


def nest_arrays(prefix: str, arrays: Mapping[str, Any]) -> dict[str, Any]:
    """`arrays` under `prefix/` (the inverse of `sub_arrays`)."""
    return {f"{prefix}/{name}": value for name, value in arrays.items()}
