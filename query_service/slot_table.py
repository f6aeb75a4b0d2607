"""Which chunk each slot of an in-process index holds (BM25, `sparse_index`; vectors, `dense_index`):
its chunk id, its document, the tenant, its filterable attributes (`chunk_attrs`) and whether it is
still live. An index keeps its own payload (postings, vectors) per slot beside it.

A tenant's slots are numbered densely; a document's chunks hold consecutive slots. The table has
two parts, as the indexes do:

  * the compact part, slots 0..compact_size-1: numpy arrays only (chunk ids and document ids as
    `StringTable`s, each document's first slot as an offsets array), built by a compaction or
    memory-mapped from a snapshot, never changed in place;
  * the recent part, the slots added since: Python lists and a dict (document id -> its slots),
    cheap to append to.

Removing a document marks its slots dead in `alive` (a writable array over both parts) and its
document entry dead; a compaction (`merged`) makes a new table of the live slots, all compact, in
the same order. Tables are replaced, not changed, by a compaction, so a reader that still holds the
old one (an attribute view, say) keeps reading what it read before.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from query_service.chunk_attrs import ChunkAttrs, ChunkAttrsTable
from query_service.ragged_arrays import StringTable, nest_arrays, string_hash, sub_arrays
from ragrpc.store import schema


class GrowableArray:
    """A numpy array with amortised O(1) append: per-slot flags and lengths of the recent part."""

    def __init__(self, dtype: Any, capacity: int = 1024) -> None:
        self.data: np.ndarray = np.zeros(max(1, capacity), dtype=dtype)
        self.size = 0

    @classmethod
    def of(cls, values: np.ndarray, min_capacity: int = 1024) -> GrowableArray:
        grown = cls(values.dtype, max(min_capacity, len(values)))
        grown.data[: len(values)] = values
        grown.size = len(values)
        return grown

    def extend(self, value: Any, count: int) -> None:
        """`count` more entries, each `value`."""
        needed = self.size + count
        if needed > len(self.data):
            grown = np.zeros(max(needed, len(self.data) * 3 // 2), dtype=self.data.dtype)
            grown[: self.size] = self.data[: self.size]
            self.data = grown
        self.data[self.size : needed] = value
        self.size = needed

    def append(self, value: Any) -> None:
        self.extend(value, 1)

    def view(self) -> np.ndarray:
        return self.data[: self.size]


class SlotTable:
    """The slots of one tenant's part of an index (see the module docstring)."""

    identity_names = frozenset({schema.CHUNK_ID, schema.DOCUMENT_ID, schema.TENANT})

    def __init__(
        self,
        tenant: str,
        chunk_ids: StringTable | None = None,
        document_ids: StringTable | None = None,
        document_starts: np.ndarray | None = None,
        attrs: ChunkAttrsTable | None = None,
    ) -> None:
        self.tenant = tenant
        self._chunk_ids = chunk_ids or StringTable.build([], lookup=False)
        self._document_ids = document_ids or StringTable.build([], lookup=True)
        # compact document i holds slots document_starts[i]..document_starts[i + 1] - 1
        self._document_starts = document_starts if document_starts is not None else np.zeros(1, dtype=np.int64)
        self.compact_size = len(self._chunk_ids)
        documents = len(self._document_ids)
        self._document_alive = np.ones(documents, dtype=np.bool_)
        self.attrs = attrs or ChunkAttrsTable()
        self._recent_chunk_ids: list[str] = []
        self._recent_documents: dict[str, tuple[int, int]] = {}  # live: (first slot, chunks), in slot order
        self._recent_document_ids: list[str] = []  # every recent document ever added, live or not
        self._recent_document_firsts = array("q")  # the first slot of each of those
        self.alive = GrowableArray.of(np.ones(self.compact_size, dtype=np.bool_))
        self.live_slots = self.compact_size
        self.dead_slots = 0
        self.live_documents = documents
        if len(self.attrs) != self.compact_size or int(self._document_starts[-1]) != self.compact_size:
            raise ValueError("slot table parts disagree on the number of slots")

    # --- size ------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Slots in use, live or dead."""
        return self.compact_size + len(self._recent_chunk_ids)

    @property
    def recent_size(self) -> int:
        return len(self._recent_chunk_ids)

    # --- documents -------------------------------------------------------------------
    def find(self, document_id: str) -> tuple[int, int] | None:
        """(first slot, chunks) of a live document, or None."""
        found = self._recent_documents.get(document_id)
        if found is not None:
            return found
        row = self._compact_row(document_id)
        if row < 0:
            return None
        first = int(self._document_starts[row])
        return first, int(self._document_starts[row + 1]) - first

    def _compact_row(self, document_id: str) -> int:
        """The live compact document's row, or -1."""
        if not len(self._document_ids):
            return -1
        row = self._document_ids.find(document_id.encode())
        return row if row >= 0 and self._document_alive[row] else -1

    def append(self, document_id: str, chunk_ids: Sequence[str], attrs: Sequence[Mapping[str, Any]]) -> int:
        """Slots for a new document's chunks (the caller made sure it is not live); its first slot."""
        first = self.size
        self.attrs.append_document(attrs, skip=self.identity_names)
        self._recent_chunk_ids.extend(chunk_ids)
        self._recent_documents[document_id] = (first, len(chunk_ids))
        self._recent_document_ids.append(document_id)
        self._recent_document_firsts.append(first)
        self.alive.extend(True, len(chunk_ids))
        self.live_slots += len(chunk_ids)
        self.live_documents += 1
        return first

    def remove(self, document_id: str) -> tuple[int, int] | None:
        """Marks a live document's slots dead; its (first slot, chunks), or None if it was not live."""
        found = self._recent_documents.pop(document_id, None)
        if found is not None:
            first, count = found
        else:
            row = self._compact_row(document_id)
            if row < 0:
                return None
            self._document_alive[row] = False
            first = int(self._document_starts[row])
            count = int(self._document_starts[row + 1]) - first
        self.alive.data[first : first + count] = False
        self.live_slots -= count
        self.dead_slots += count
        self.live_documents -= 1
        return first, count

    def slots_of(self, document_ids: Collection[str]) -> np.ndarray:
        """The slots of those of `document_ids` that are live documents."""
        ranges = [found for found in map(self.find, set(document_ids)) if found is not None]
        if not ranges:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.arange(first, first + count) for first, count in ranges])

    # --- slots -----------------------------------------------------------------------
    def chunk_id(self, slot: int) -> str:
        if slot < self.compact_size:
            return self._chunk_ids[slot]
        return self._recent_chunk_ids[slot - self.compact_size]

    def document_id(self, slot: int) -> str:
        if slot < self.compact_size:
            row = int(self._document_starts.searchsorted(slot, side="right")) - 1
            return self._document_ids[row]
        return self._recent_document_ids[bisect.bisect_right(self._recent_document_firsts, slot) - 1]

    def identity_value(self, name: str, slot: int) -> Any:
        if name == schema.CHUNK_ID:
            return self.chunk_id(slot)
        if name == schema.DOCUMENT_ID:
            return self.document_id(slot)
        return self.tenant

    def view(self, slot: int) -> ChunkAttrs:
        """The slot's attributes as filters read them (with tenant, document_id and chunk_id)."""
        return ChunkAttrs(self.attrs, slot, self)

    # --- compaction ------------------------------------------------------------------
    def live(self) -> np.ndarray:
        """The live slots, ascending."""
        return np.flatnonzero(self.alive.view())

    def merged(self, keep: np.ndarray) -> SlotTable:
        """A new table of the live slots (`keep`, from `live()`), renumbered 0.. in order, all compact."""
        compact_keep = keep[keep < self.compact_size]
        recent_keep = keep[keep >= self.compact_size] - self.compact_size
        live_compact = np.flatnonzero(self._document_alive)
        starts = self._document_starts
        recent = list(self._recent_documents.items())
        counts = np.concatenate(
            (starts[live_compact + 1] - starts[live_compact], np.array([c for _, (_, c) in recent], dtype=np.int64))
        )
        document_starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=document_starts[1:])
        if int(document_starts[-1]) != len(keep):
            raise AssertionError("live slots and live documents disagree")  # an index bug, never data
        added = [document_id.encode() for document_id, _ in recent]
        document_ids = StringTable.combine(
            self._document_ids, live_compact, added, lookup=True, added_hashes=[string_hash(a) for a in added]
        )
        recent_ids = [self._recent_chunk_ids[i].encode() for i in recent_keep.tolist()]
        chunk_ids = StringTable.combine(self._chunk_ids, compact_keep, recent_ids, lookup=False)
        return SlotTable(self.tenant, chunk_ids, document_ids, document_starts, self.attrs.merged(keep))

    # --- snapshot --------------------------------------------------------------------
    def export(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(meta, arrays) of a compacted table with no dead slot (compact first)."""
        if self.recent_size or self.dead_slots:
            raise ValueError("export of a slot table that is not compacted")
        attrs_meta, attrs_arrays = self.attrs.export()
        arrays = {
            **nest_arrays("chunk_ids", self._chunk_ids.export()),
            **nest_arrays("document_ids", self._document_ids.export()),
            "document_starts": self._document_starts,
            **nest_arrays("attrs", attrs_arrays),
        }
        return {"tenant": self.tenant, "attrs": attrs_meta}, arrays

    @classmethod
    def restore(cls, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> SlotTable:
        starts = arrays["document_starts"]
        if starts.ndim != 1 or not len(starts) or int(starts[0]) != 0:
            raise ValueError("document starts do not begin at slot 0")
        document_ids = StringTable.restore(sub_arrays(arrays, "document_ids"))
        if len(document_ids) != len(starts) - 1:
            raise ValueError("document ids and document starts disagree")
        return cls(
            str(meta["tenant"]),
            StringTable.restore(sub_arrays(arrays, "chunk_ids")),
            document_ids,
            starts,
            ChunkAttrsTable.restore(meta["attrs"], sub_arrays(arrays, "attrs")),
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the compact arrays, the liveness flags and the attributes' compact columns."""
        return (
            self._chunk_ids.nbytes
            + self._document_ids.nbytes
            + self._document_starts.nbytes
            + self._document_alive.nbytes
            + self.alive.data.nbytes
            + self.attrs.nbytes
        )
