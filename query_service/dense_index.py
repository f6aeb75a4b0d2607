"""An in-process copy of the chunks' vectors for exact dense search, per tenant.

milvus-lite's own vector search costs about 27 ms at 10k chunks and 170 ms at 100k on 2 cores,
where an exact search over the same vectors in memory costs 0.4 ms and 8 ms (`make bench`,
scale section). So where the store is milvus-lite, the query service keeps the vectors of the
visible chunks in memory, filled and kept in step by the same sync as the BM25 index
(query_service.index_sync: one paged scan at start, batches of registry changes after), and
searches them exactly: recall 1.0 against exact search by construction. A Milvus server
searches its own index (`RAGRPC_DENSE_SEARCH`, query_service.dense).

Memory: the vector (4 bytes a dimension: 1.5 KB at 384) and the chunk's filter attributes,
shared with the BM25 index when both hold the chunk. Removed documents leave holes that a
compaction closes once they outnumber the live chunks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from query_service.chunk_attrs import ChunkAttrsTable
from query_service.rw_lock import ReadWriteLock

logger = logging.getLogger(__name__)

AttrPredicate = Callable[[Mapping[str, Any]], bool]
_MIN_CAPACITY = 1024


class VectorChunk(NamedTuple):
    """A chunk to hold: its id, unit vector and filterable attributes (schema field -> value)."""

    chunk_id: str
    vector: Sequence[float] | np.ndarray
    attrs: Mapping[str, Any]


class _Scope:
    """The vectors of one tenant; rows are slots, a removed document's slots are dead until compaction."""

    def __init__(self, dimension: int) -> None:
        self.vectors = np.zeros((0, dimension), dtype=np.float32)
        self.size = 0
        self.alive = np.zeros(0, dtype=np.bool_)
        self.chunk_ids: list[str] = []
        self.attrs = ChunkAttrsTable()
        self.documents: dict[str, range] = {}
        self.live = 0
        self.dead = 0

    def add(self, document_id: str, chunks: Sequence[VectorChunk], matrix: np.ndarray) -> None:
        needed = self.size + len(chunks)
        if needed > len(self.vectors):
            capacity = max(_MIN_CAPACITY, needed, len(self.vectors) * 3 // 2)
            grown = np.zeros((capacity, self.vectors.shape[1]), dtype=np.float32)
            grown[: self.size] = self.vectors[: self.size]
            alive = np.zeros(capacity, dtype=np.bool_)
            alive[: self.size] = self.alive[: self.size]
            self.vectors, self.alive = grown, alive
        self.vectors[self.size : needed] = matrix
        self.alive[self.size : needed] = True
        self.chunk_ids.extend(chunk.chunk_id for chunk in chunks)
        self.attrs.append_document([chunk.attrs for chunk in chunks])
        self.documents[document_id] = range(self.size, needed)
        self.size = needed
        self.live += len(chunks)

    def remove(self, document_id: str) -> bool:
        slots = self.documents.pop(document_id, None)
        if slots is None:
            return False
        self.alive[slots.start : slots.stop] = False
        self.live -= len(slots)
        self.dead += len(slots)
        if self.dead >= max(_MIN_CAPACITY, self.live):
            self.compact()
        return True

    def compact(self) -> None:
        keep = np.flatnonzero(self.alive[: self.size])
        new_slot = np.cumsum(self.alive[: self.size], dtype=np.int64) - 1
        self.vectors = np.ascontiguousarray(self.vectors[keep])
        self.alive = np.ones(len(keep), dtype=np.bool_)
        self.chunk_ids = [self.chunk_ids[i] for i in keep]
        self.attrs.keep(keep.tolist())
        self.documents = {
            doc: range(int(new_slot[slots.start]), int(new_slot[slots.start]) + len(slots)) if len(slots) else range(0)
            for doc, slots in self.documents.items()
        }
        self.size = len(keep)
        self.dead = 0

    def trim(self) -> None:
        if len(self.vectors) > self.size:
            self.vectors = self.vectors[: self.size].copy()
            self.alive = self.alive[: self.size].copy()

    def slots_of(self, document_ids: Collection[str]) -> np.ndarray:
        found = [self.documents.get(document_id, range(0)) for document_id in set(document_ids)]
        return np.concatenate([np.arange(r.start, r.stop) for r in found]) if found else np.zeros(0, dtype=np.int64)


class InProcessDenseIndex:
    """Exact cosine (dot product of unit vectors) search over the tenant's chunks in memory."""

    def __init__(self, dimension: int) -> None:
        self.dimension = dimension
        self._scopes: dict[str, _Scope] = {}
        self._lock = ReadWriteLock()

    def replace_document(self, tenant: str, document_id: str, chunks: Sequence[VectorChunk]) -> None:
        """The document's chunks become `chunks` (none: the document leaves the index)."""
        matrix = self._matrix(chunks)
        with self._lock.write():
            scope = self._scopes.get(tenant)
            if scope is None:
                if not chunks:
                    return
                scope = self._scopes[tenant] = _Scope(self.dimension)
            scope.remove(document_id)
            if chunks:
                scope.add(document_id, chunks, matrix)

    def remove_document(self, tenant: str, document_id: str) -> bool:
        with self._lock.write():
            scope = self._scopes.get(tenant)
            return scope.remove(document_id) if scope is not None else False

    def _matrix(self, chunks: Sequence[VectorChunk]) -> np.ndarray:
        if not chunks:
            return np.zeros((0, self.dimension), dtype=np.float32)
        matrix = np.asarray([chunk.vector for chunk in chunks], dtype=np.float32)
        if matrix.ndim != 2 or matrix.shape[1] != self.dimension:
            raise ValueError(f"vectors of dimension {matrix.shape[-1]} in an index of dimension {self.dimension}")
        return matrix

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
            if scope is None or not scope.live:
                return []
            if document_ids is not None:
                slots = scope.slots_of(document_ids)
                slots = slots[scope.alive[slots]] if len(slots) else slots
                scores = scope.vectors[slots] @ query
            else:
                scores = scope.vectors[: scope.size] @ query
                slots = np.arange(scope.size)
                if scope.dead:
                    live = scope.alive[: scope.size]
                    slots, scores = slots[live], scores[live]
            return _best_allowed(scope, slots, scores, top_k, allow)

    def trim(self) -> None:
        """Gives back the room the tenants' arrays grew into (after the start-up load)."""
        with self._lock.write():
            for scope in self._scopes.values():
                scope.trim()

    def chunk_count(self, tenant: str) -> int:
        with self._lock.read():
            scope = self._scopes.get(tenant)
            return scope.live if scope else 0

    def memory_bytes(self) -> int:
        with self._lock.read():
            return sum(scope.vectors.nbytes for scope in self._scopes.values())


def _best_allowed(
    scope: _Scope, slots: np.ndarray, scores: np.ndarray, top_k: int, allow: AttrPredicate | None
) -> list[tuple[str, float]]:
    """The best `top_k` slots that pass `allow` (ties by chunk id): a head of twice what is asked
    is sorted first, and grown while filters reject (a selective filter scans further)."""
    out: list[tuple[str, float]] = []
    seen: set[int] = set()
    head = min(len(scores), max(2 * top_k, 64))
    while len(out) < top_k and len(seen) < len(scores):
        part = np.argpartition(-scores, head - 1)[:head] if head < len(scores) else np.arange(len(scores))
        ids = np.asarray([scope.chunk_ids[slots[i]] for i in part])
        for i in part[np.lexsort((ids, -scores[part]))]:
            index = int(i)
            if index in seen:
                continue
            seen.add(index)
            slot = int(slots[index])
            if allow is None or allow(scope.attrs.view(slot, scope.chunk_ids[slot])):
                out.append((scope.chunk_ids[slot], float(scores[index])))
                if len(out) == top_k:
                    break
        head = min(len(scores), head * 4)
    return out
