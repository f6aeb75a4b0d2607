"""An in-process copy of the chunks' vectors for exact dense search, per tenant.

milvus-lite's own vector search costs about 27 ms at 10k chunks and 170 ms at 100k on 2 cores,
where an exact search over the same vectors in memory costs 0.4 ms and 8 ms (`make bench`,
scale section). So where the store is milvus-lite, the query service keeps the vectors of the
visible chunks in memory, filled and kept in step by the same sync as the BM25 index
(query_service.index_sync: one paged scan at start, batches of registry changes after), and
searches them: exactly (recall 1.0 by construction) while a tenant holds fewer than
`RAGRPC_DENSE_PARTITIONS_MIN_CHUNKS` chunks (200k), over the nearest of its coarse partitions
above that (query_service.coarse_partitions: at 1M chunks 6-8 ms instead of 41 ms, recall@100
0.988-0.997 against exact search). A Milvus server searches its own index (`RAGRPC_DENSE_SEARCH`,
query_service.dense).

Layout per tenant, as the BM25 index's: a compact matrix (float32, one row a slot; built by a
compaction or memory-mapped from a snapshot, never changed in place) and a recent matrix the
chunks added since grow into; the slots' chunk ids, documents and attributes are a `SlotTable`
(query_service.slot_table). Removing a document marks its slots dead; a compaction makes one new
compact matrix of the live rows once the recent rows pass max(`merge_min_chunks`, `merge_ratio` x
the compact rows) or dead slots outnumber live ones, and on `compact()` / `trim()`.

Memory: the vector (4 bytes a dimension: 1.5 KB at 384) and the chunk's attributes (the
partitions add 4 bytes a row and their centroids).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from query_service.coarse_partitions import CoarsePartitions, PartitionPolicy
from query_service.ragged_arrays import nest_arrays, sub_arrays
from query_service.rw_lock import ReadWriteLock
from query_service.slot_table import SlotTable

logger = logging.getLogger(__name__)

AttrPredicate = Callable[[Mapping[str, Any]], bool]
FORMAT = 2  # of `export`'s arrays and meta (1: without partitions; still read)
_FORMATS = (1, 2)
_MIN_CAPACITY = 1024


class VectorChunk(NamedTuple):
    """A chunk to hold: its id, unit vector and filterable attributes (schema field -> value)."""

    chunk_id: str
    vector: Sequence[float] | np.ndarray
    attrs: Mapping[str, Any]


class _Scope:
    """The vectors of one tenant: compact rows (slots 0..n-1), then recent rows; the compact rows'
    partitions where the tenant is large enough to have them (query_service.coarse_partitions)."""

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

    def merged(self, policy: PartitionPolicy) -> _Merged:
        keep = self.slots.live()
        compact_keep = keep[keep < len(self.compact)]
        recent_keep = keep[keep >= len(self.compact)] - len(self.compact)
        joining = self.recent[recent_keep]
        vectors = np.concatenate((self.compact[compact_keep], joining))
        partitions = None
        if policy.wanted(len(vectors)):
            if self.partitions is None or policy.outgrown(self.partitions, len(vectors)):
                partitions = CoarsePartitions.train(vectors, policy.lists_for(len(vectors)))
            else:
                partitions = self.partitions.carried(compact_keep, joining)
        return _Merged(vectors, self.slots.merged(keep), partitions)

    def install(self, merged: _Merged) -> None:
        self.compact, self.slots, self.partitions = merged
        self.recent = np.zeros((0, self.compact.shape[1]), dtype=np.float32)

    def scores(
        self, query: np.ndarray, document_ids: Collection[str] | None, probes: int
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """(live candidate slots, their cosines, whether only the `probes` nearest partitions were
        read: 0 reads every row)."""
        slots_table, compact_size = self.slots, len(self.compact)
        if document_ids is not None:
            slots = slots_table.slots_of(document_ids)
            in_compact = slots < compact_size
            scores = np.empty(len(slots), dtype=np.float32)
            scores[in_compact] = self.compact[slots[in_compact]] @ query
            scores[~in_compact] = self.recent[slots[~in_compact] - compact_size] @ query
            return slots, scores, False
        approximate = probes > 0 and self.partitions is not None and probes < self.partitions.lists
        if approximate:
            assert self.partitions is not None
            slots, scores = self.partitions.probed(self.compact, query, probes)
            if slots_table.recent_size:
                scores = np.concatenate((scores, self.recent[: slots_table.recent_size] @ query))
                slots = np.concatenate((slots, np.arange(compact_size, compact_size + slots_table.recent_size)))
            if slots_table.dead_slots:
                live = slots_table.alive.view()[slots]
                slots, scores = slots[live], scores[live]
            return slots, scores, True
        scores = self.compact @ query
        if slots_table.recent_size:
            scores = np.concatenate((scores, self.recent[: slots_table.recent_size] @ query))
        slots = np.arange(len(scores))
        if slots_table.dead_slots:
            live = slots_table.alive.view()
            slots, scores = slots[live], scores[live]
        return slots, scores, False

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
            slots, scores, approximate = scope.scores(query, document_ids, self.partition_policy.probes)
            found = _best_allowed(scope.slots, slots, scores, top_k, allow)
            if approximate and len(found) < top_k:  # a filter passed too few of the probed rows
                slots, scores, _ = scope.scores(query, document_ids, 0)
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

    @classmethod
    def restore(cls, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray], **options: Any) -> InProcessDenseIndex:
        """An index over exported arrays (memory-mapped vectors are searched in place, never copied
        whole); ValueError when they are not a consistent export of this format. Partitions the
        export lacks but the policy wants (format 1, or a smaller tenant then) are trained here."""
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
            if index.partition_policy.wanted(len(vectors)):
                if scope_meta.get("partitions"):
                    partitions = CoarsePartitions.restore(
                        sub_arrays(arrays, f"s{number}/partitions"), len(vectors), index.dimension
                    )
                else:
                    partitions = CoarsePartitions.train(vectors, index.partition_policy.lists_for(len(vectors)))
            index._scopes[tenant] = _Scope(tenant, index.dimension, vectors, slots, partitions)
        return index


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
