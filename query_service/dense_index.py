"""An in-process copy of the chunks' vectors for dense search, per tenant.

milvus-lite's own vector search costs about 27 ms at 10k chunks and 170 ms at 100k on 2 cores,
where an exact search over the same vectors in memory costs 0.4 ms and 8 ms (`make bench`,
scale section). So where the store is milvus-lite, the query service keeps the vectors of the
visible chunks in memory, filled and kept in step by the same sync as the BM25 index
(query_service.index_sync: one paged scan at start, batches of registry changes after), and
searches them: exactly (recall 1.0 by construction) while a tenant holds fewer than
`RAGRPC_DENSE_PARTITIONS_MIN_CHUNKS` chunks (200k), over the nearest 10 % of its coarse partitions
above that (query_service.coarse_partitions; approximate, its recall in docs/benchmarks.md). Exact
searches that run at the same time share one pass over the vectors (query_service.shared_passes). A
Milvus server searches its own index (`RAGRPC_DENSE_SEARCH`, query_service.dense).

Layout per tenant, as the BM25 index's: a compact matrix (float32, one row a slot, stored list by
list where the tenant has partitions; built by a compaction or memory-mapped from a snapshot, never
changed in place) and a recent matrix the chunks added since grow into; the slots' chunk ids,
documents and attributes are a `SlotTable` (query_service.slot_table). Removing a document marks its
slots dead; a compaction makes one new compact matrix of the live rows once the recent rows pass
max(`merge_min_chunks`, `merge_ratio` x the compact rows) or dead slots outnumber live ones, and on
`compact()` / `trim()`.

Memory: the vector (4 bytes a dimension: 1.5 KB at 384) and the chunk's attributes (the
partitions add 8 bytes a row and their centroids).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from query_service.coarse_partitions import EXACT, CoarsePartitions, PartitionPolicy, assign
from query_service.ragged_arrays import nest_arrays, sub_arrays
from query_service.rw_lock import ReadWriteLock
from query_service.shared_passes import SharedPasses
from query_service.slot_table import SlotTable

logger = logging.getLogger(__name__)

AttrPredicate = Callable[[Mapping[str, Any]], bool]
FORMAT = 3  # of `export`'s arrays and meta (1: without partitions, still read; 2: a layout never released)
_FORMATS = (1, 3)
_MIN_CAPACITY = 1024
_COPY_BATCH = 65536  # rows copied at once by a compaction


class VectorChunk(NamedTuple):
    """A chunk to hold: its id, unit vector and filterable attributes (schema field -> value)."""

    chunk_id: str
    vector: Sequence[float] | np.ndarray
    attrs: Mapping[str, Any]


class _Scope:
    """The vectors of one tenant: the compact rows (slots 0..n-1), then recent rows. Where the tenant
    has coarse partitions (query_service.coarse_partitions) the compact rows are stored list by list
    and the partitions map rows to slots; otherwise row i holds slot i."""

    def __init__(
        self,
        tenant: str,
        dimension: int,
        vectors: np.ndarray | None = None,
        slots: SlotTable | None = None,
        partitions: CoarsePartitions | None = None,
    ):
        self.compact = vectors if vectors is not None else np.zeros((0, dimension), dtype=np.float32)
        self.slots = slots or SlotTable(tenant)
        if self.slots.compact_size != len(self.compact) or self.compact.shape[1:] != (dimension,):
            raise ValueError("vectors and slot table disagree")
        if partitions is not None and partitions.rows != len(self.compact):
            raise ValueError("partitions and vectors disagree")
        self.partitions = partitions
        self.recent = np.zeros((0, dimension), dtype=np.float32)  # rows: capacity; in use: slots.recent_size

    def add(self, document_id: str, chunk_ids: list[str], attrs: list[Mapping[str, Any]], matrix: np.ndarray) -> None:
        used = self.slots.recent_size
        needed = used + len(matrix)
        if needed > len(self.recent):
            grown = np.zeros((max(_MIN_CAPACITY, needed, len(self.recent) * 3 // 2), self.recent.shape[1]), np.float32)
            grown[:used] = self.recent[:used]
            self.recent = grown
        self.recent[used:needed] = matrix
        self.slots.append(document_id, chunk_ids, attrs)

    def _rows_of(self, slots: np.ndarray) -> np.ndarray:
        """The compact rows of compact `slots`."""
        return self.partitions.slot_row[slots] if self.partitions is not None else slots

    def _read(self, sources: np.ndarray) -> np.ndarray:
        """Vectors by source number: compact rows 0..n-1, then recent rows."""
        size = len(self.compact)
        out = np.empty((len(sources), self.compact.shape[1]), dtype=np.float32)
        in_compact = sources < size
        out[in_compact] = self.compact[sources[in_compact]]
        out[~in_compact] = self.recent[sources[~in_compact] - size]
        return out

    def merged(self, policy: PartitionPolicy) -> _Merged:
        """The live slots as a new compact matrix (list by list where the policy wants partitions)."""
        keep = self.slots.live()
        size = len(self.compact)
        from_compact = keep < size
        sources = keep.astype(np.int64)  # each new slot's source: a compact row, or size + its recent row
        sources[from_compact] = self._rows_of(keep[from_compact])
        partitions = None
        if policy.wanted(len(keep)):
            if self.partitions is None or policy.outgrown(self.partitions, len(keep)):
                lists = policy.lists_for(len(keep))
                centroids = CoarsePartitions.train(lambda n: self._read(sources[n]), len(keep), lists)
                assignment = assign(self._read, sources, centroids)
            else:
                centroids = self.partitions.centroids
                assignment = np.empty(len(keep), dtype=np.int32)
                assignment[from_compact] = self.partitions.lists_of_rows(sources[from_compact])
                assignment[~from_compact] = assign(self._read, sources[~from_compact], centroids)
            partitions = CoarsePartitions.laid_out(centroids, assignment)
            sources = sources[partitions.row_slot]
        vectors = np.empty((len(sources), self.compact.shape[1]), dtype=np.float32)
        for start in range(0, len(sources), _COPY_BATCH):  # no second whole copy on the way
            vectors[start : start + _COPY_BATCH] = self._read(sources[start : start + _COPY_BATCH])
        return _Merged(vectors, self.slots.merged(keep), partitions)

    def install(self, merged: _Merged) -> None:
        self.compact, self.slots, self.partitions = merged
        self.recent = np.zeros((0, self.compact.shape[1]), dtype=np.float32)

    def scores(
        self,
        query: np.ndarray,
        document_ids: Collection[str] | None,
        policy: PartitionPolicy,
        passes: SharedPasses,
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """(live candidate slots, their cosines, whether only the nearest partitions were read). A search
        of every row goes through `passes` (shared with the searches running meanwhile)."""
        slots_table, size, partitions = self.slots, len(self.compact), self.partitions
        if document_ids is not None:
            slots = slots_table.slots_of(document_ids)
            in_compact = slots < size
            scores = np.empty(len(slots), dtype=np.float32)
            scores[in_compact] = self.compact[self._rows_of(slots[in_compact])] @ query
            scores[~in_compact] = self.recent[slots[~in_compact] - size] @ query
            return slots, scores, False
        probes = policy.probes(partitions.lists) if partitions is not None and policy.wanted(size) else 0
        if not (partitions is not None and 0 < probes < partitions.lists):
            return (*passes.scores(self, query, self.pass_over), False)
        offsets = partitions.offsets
        ranges = [(int(offsets[i]), int(offsets[i + 1])) for i in partitions.nearest_lists(query, probes)]
        parts = [self.compact[start:stop] @ query for start, stop in ranges]
        slot_parts = [partitions.row_slot[start:stop] for start, stop in ranges]
        return (*self._live(parts, slot_parts, query), True)

    def pass_over(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(live slots, their cosines with each of `queries`: slots x queries) over every row. One query
        is the matrix-vector product; several read the matrix once for all of them."""
        size, partitions = len(self.compact), self.partitions
        block = queries[0] if len(queries) == 1 else queries.T
        parts = [self.compact @ block]
        slot_parts = [partitions.row_slot if partitions is not None else np.arange(size)]
        slots, scores = self._live(parts, slot_parts, block)
        return slots, scores.reshape(len(slots), len(queries))

    def _live(
        self, parts: list[np.ndarray], slot_parts: list[np.ndarray], query: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The scored rows (`parts`, of the slots `slot_parts`) and the recent rows scored with `query`
        (a vector, or dimension x queries), of live slots only."""
        slots_table, size = self.slots, len(self.compact)
        if slots_table.recent_size:
            parts = [*parts, self.recent[: slots_table.recent_size] @ query]
            slot_parts = [*slot_parts, np.arange(size, size + slots_table.recent_size)]
        # never empty: at least one list, or the whole compact matrix (one part: no copy)
        scores = parts[0] if len(parts) == 1 else np.concatenate(parts)
        slots = (slot_parts[0] if len(slot_parts) == 1 else np.concatenate(slot_parts)).astype(np.int64, copy=False)
        if slots_table.dead_slots:
            live = slots_table.alive.view()[slots]
            slots, scores = slots[live], scores[live]
        return slots, scores

    @property
    def nbytes(self) -> int:
        partitions = self.partitions.nbytes if self.partitions is not None else 0
        return self.compact.nbytes + self.recent.nbytes + self.slots.nbytes + partitions


class _Merged(NamedTuple):
    """A scope's next compact state: the vectors, their slot table and partitions (or None)."""

    vectors: np.ndarray
    slots: SlotTable
    partitions: CoarsePartitions | None


class InProcessDenseIndex:
    """Cosine (dot product of unit vectors) search over the tenant's chunks in memory: exact, or
    over the nearest partitions where the tenant has them (`partitions`; a filtered search that
    finds fewer than asked there searches every row)."""

    def __init__(
        self,
        dimension: int,
        *,
        partitions: PartitionPolicy | None = None,
        compaction_min_dead: int = _MIN_CAPACITY,
        merge_min_chunks: int = 16384,
        merge_ratio: float = 0.25,
    ) -> None:
        self.dimension = dimension
        self.partition_policy = partitions if partitions is not None else PartitionPolicy()
        self._compaction_min_dead = compaction_min_dead
        self._merge_min_chunks = merge_min_chunks
        self._merge_ratio = merge_ratio
        self._scopes: dict[str, _Scope] = {}
        self._lock = ReadWriteLock()
        self._writer = threading.Lock()  # one change (and the compaction it triggers) at a time
        self.passes = SharedPasses()  # exact searches running at once share a pass over the vectors

    def replace_document(self, tenant: str, document_id: str, chunks: Sequence[VectorChunk]) -> None:
        """The document's chunks become `chunks` (none: the document leaves the index)."""
        matrix = self._matrix(chunks)
        with self._writer:
            with self._lock.write():
                scope = self._scopes.get(tenant)
                if scope is None:
                    if not chunks:
                        return
                    scope = self._scopes[tenant] = _Scope(tenant, self.dimension)
                scope.slots.remove(document_id)
                if chunks:
                    scope.add(document_id, [c.chunk_id for c in chunks], [c.attrs for c in chunks], matrix)
            self._compact_if_due(scope)

    def remove_document(self, tenant: str, document_id: str) -> bool:
        with self._writer:
            scope = self._scopes.get(tenant)
            if scope is None:
                return False
            with self._lock.write():
                removed = scope.slots.remove(document_id) is not None
            self._compact_if_due(scope)
            return removed

    def _matrix(self, chunks: Sequence[VectorChunk]) -> np.ndarray:
        if not chunks:
            return np.zeros((0, self.dimension), dtype=np.float32)
        matrix = np.asarray([chunk.vector for chunk in chunks], dtype=np.float32)
        if matrix.ndim != 2 or matrix.shape[1] != self.dimension:
            raise ValueError(f"vectors of dimension {matrix.shape[-1]} in an index of dimension {self.dimension}")
        return matrix

    def _compact_if_due(self, scope: _Scope) -> None:
        slots = scope.slots
        dead_due = slots.dead_slots >= max(self._compaction_min_dead, slots.live_slots)
        recent_due = slots.recent_size >= max(self._merge_min_chunks, self._merge_ratio * slots.compact_size)
        if dead_due or recent_due:
            self._install(scope)

    def _install(self, scope: _Scope) -> None:
        merged = scope.merged(self.partition_policy)  # readers go on reading the old arrays meanwhile
        with self._lock.write():
            scope.install(merged)

    def compact(self) -> None:
        """Fold the recent rows into the compact matrix and drop dead rows now (a copy of the live rows)."""
        with self._writer:
            for scope in list(self._scopes.values()):
                if scope.slots.recent_size or scope.slots.dead_slots:
                    self._install(scope)

    def trim(self) -> None:
        """Gives back the room the tenants' arrays grew into (after the start-up load): `compact`."""
        self.compact()

    def search(
        self,
        vector: np.ndarray,
        top_k: int,
        *,
        tenant: str,
        allow: AttrPredicate | None = None,
        document_ids: Collection[str] | None = None,
    ) -> list[tuple[str, float]]:
        """Best `top_k` (chunk_id, cosine) of the tenant's chunks passing `allow`, best first.
        `document_ids` restricts the candidates before `allow` runs (per candidate, in score order)."""
        if top_k <= 0:
            return []
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        with self._lock.read():
            scope = self._scopes.get(tenant)
            if scope is None or not scope.slots.live_slots:
                return []
            slots, scores, approximate = scope.scores(query, document_ids, self.partition_policy, self.passes)
            found = _best_allowed(scope.slots, slots, scores, top_k, allow)
            if approximate and len(found) < top_k:  # a filter passed too few of the probed rows
                slots, scores, _ = scope.scores(query, document_ids, EXACT, self.passes)
                found = _best_allowed(scope.slots, slots, scores, top_k, allow)
            return found

    def chunk_count(self, tenant: str) -> int:
        with self._lock.read():
            scope = self._scopes.get(tenant)
            return scope.slots.live_slots if scope else 0

    def memory_bytes(self) -> int:
        """Bytes of the held vectors (memory-mapped ones included), their room to grow and the slot tables."""
        with self._lock.read():
            return sum(scope.nbytes for scope in self._scopes.values())

    # --- snapshot ----------------------------------------------------------------------
    def export(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(meta, arrays) of the whole index, compacted first (arrays never changed afterwards)."""
        with self._writer:
            for scope in list(self._scopes.values()):
                if scope.slots.recent_size or scope.slots.dead_slots:
                    self._install(scope)
            meta: dict[str, Any] = {"format": FORMAT, "dimension": self.dimension, "scopes": []}
            arrays: dict[str, np.ndarray] = {}
            for number, (tenant, scope) in enumerate(self._scopes.items()):
                slots_meta, slots_arrays = scope.slots.export()
                partitioned = scope.partitions is not None
                meta["scopes"].append({"tenant": tenant, "slots": slots_meta, "partitions": partitioned})
                arrays[f"s{number}/vectors"] = scope.compact
                arrays.update(nest_arrays(f"s{number}/slots", slots_arrays))
                if scope.partitions is not None:
                    arrays.update(nest_arrays(f"s{number}/partitions", scope.partitions.export()))
            return meta, arrays

    def adopt(self, other: InProcessDenseIndex) -> None:
        """Takes over the held vectors of `other` (an index restored from a snapshot that another process
        built), so that everything holding this index searches and changes them; `other` must not be used
        afterwards. ValueError when its dimension is not this index's."""
        if other.dimension != self.dimension:
            raise ValueError(f"held vectors of dimension {other.dimension} cannot replace {self.dimension}")
        with self._writer, self._lock.write():
            self._scopes = other._scopes
            other._scopes = {}

    @classmethod
    def restore(cls, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray], **options: Any) -> InProcessDenseIndex:
        """An index over exported arrays (memory-mapped vectors are searched in place, never copied
        whole); ValueError when they are not a consistent export of this format, `WithoutPartitions`
        when a tenant the policy wants partitioned was exported without partitions (by an earlier
        version, or under another policy): laying them out would copy the vectors, which a full load
        does as well and then writes a snapshot that has them."""
        if meta.get("format") not in _FORMATS:
            raise ValueError(f"dense index format {meta.get('format')!r}, expected one of {_FORMATS}")
        index = cls(int(meta["dimension"]), **options)
        for number, scope_meta in enumerate(meta["scopes"]):
            tenant = str(scope_meta["tenant"])
            slots = SlotTable.restore(scope_meta["slots"], sub_arrays(arrays, f"s{number}/slots"))
            if slots.tenant != tenant:
                raise ValueError(f"scope of {tenant!r} holds the slots of {slots.tenant!r}")
            vectors = arrays[f"s{number}/vectors"]
            if vectors.dtype != np.float32 or vectors.ndim != 2:
                raise ValueError("held vectors are not a float32 matrix")
            partitions = None
            if scope_meta.get("partitions"):  # the rows are laid out by them, wanted or not
                partitions = CoarsePartitions.restore(
                    sub_arrays(arrays, f"s{number}/partitions"), len(vectors), index.dimension
                )
            elif index.partition_policy.wanted(len(vectors)):
                raise WithoutPartitions(
                    f"the held vectors of tenant {tenant!r} ({len(vectors)} chunks) have no coarse partitions, which"
                    f" RAGRPC_DENSE_PARTITIONS_MIN_CHUNKS={index.partition_policy.min_chunks} asks for"
                )
            index._scopes[tenant] = _Scope(tenant, index.dimension, vectors, slots, partitions)
        return index


class WithoutPartitions(ValueError):
    """An export whose held vectors lack the coarse partitions the policy wants (not corrupt)."""


def _best_allowed(
    slot_table: SlotTable, slots: np.ndarray, scores: np.ndarray, top_k: int, allow: AttrPredicate | None
) -> list[tuple[str, float]]:
    """The best `top_k` slots that pass `allow` (ties by chunk id): a head of twice what is asked
    is sorted first, and grown while filters reject (a selective filter scans further)."""
    out: list[tuple[str, float]] = []
    seen: set[int] = set()
    head = min(len(scores), max(2 * top_k, 64))
    while len(out) < top_k and len(seen) < len(scores):
        part = np.argpartition(-scores, head - 1)[:head] if head < len(scores) else np.arange(len(scores))
        ids = np.asarray([slot_table.chunk_id(int(slots[i])) for i in part])
        for i in part[np.lexsort((ids, -scores[part]))]:
            index = int(i)
            if index in seen:
                continue
            seen.add(index)
            slot = int(slots[index])
            if allow is None or allow(slot_table.view(slot)):
                out.append((slot_table.chunk_id(slot), float(scores[index])))
                if len(out) == top_k:
                    break
        head = min(len(scores), head * 4)
    return out
