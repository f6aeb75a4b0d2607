"""In-memory ChunkStore and DocumentRegistry with the Milvus adapters' contracts."""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
from collections.abc import Iterator

import numpy as np

from ragrpc.models import (
    ChunkRecord,
    DocumentRecord,
    DocumentState,
    IngestJobRecord,
    ScoredChunk,
    StageScores,
)
from ragrpc.store.filters import FilterExpr
from ragrpc.store.milvus_chunks import chunk_to_row


class InMemoryChunkStore:
    def __init__(self, supports_bm25: bool = False, upsert_keeps_partitions: bool = True) -> None:
        self._rows: dict[str, ChunkRecord] = {}
        self._lock = threading.Lock()
        self._bm25 = supports_bm25
        self._upsert_ok = upsert_keeps_partitions
        self.fail_next_insert: Exception | None = None  # fault injection for crash tests

    @property
    def supports_bm25(self) -> bool:
        return self._bm25

    @property
    def upsert_keeps_partitions(self) -> bool:
        return self._upsert_ok

    def insert_chunks(self, chunks: list[ChunkRecord]) -> None:
        if self.fail_next_insert is not None:
            error, self.fail_next_insert = self.fail_next_insert, None
            raise error
        with self._lock:
            for chunk in chunks:
                self._rows[chunk.chunk_id] = copy.deepcopy(chunk)

    def upsert_chunks(self, chunks: list[ChunkRecord]) -> None:
        self.insert_chunks(chunks)

    def _matching(self, expr: FilterExpr) -> list[ChunkRecord]:
        with self._lock:
            return [c for c in self._rows.values() if expr.matches(chunk_to_row(c))]

    def delete_chunks(self, expr: FilterExpr) -> int:
        doomed = self._matching(expr)
        with self._lock:
            for chunk in doomed:
                self._rows.pop(chunk.chunk_id, None)
        return len(doomed)

    def count_chunks(self, expr: FilterExpr) -> int:
        return len(self._matching(expr))

    def query_chunks(self, expr: FilterExpr, limit: int = 16384, with_vectors: bool = False) -> list[ChunkRecord]:
        found = [copy.deepcopy(c) for c in self._matching(expr)[:limit]]
        if not with_vectors:
            for chunk in found:
                chunk.vector = []
        return found

    def scan_chunks(self, expr: FilterExpr, batch_size: int = 2000) -> Iterator[list[ChunkRecord]]:
        found = self.query_chunks(expr, limit=10**9)
        for start in range(0, len(found), batch_size):
            yield found[start : start + batch_size]

    def search_dense(self, vector: np.ndarray, expr: FilterExpr, limit: int) -> list[ScoredChunk]:
        candidates = self._matching(expr)
        if not candidates:
            return []
        matrix = np.array([c.vector for c in candidates], dtype=np.float32)
        scores = matrix @ np.asarray(vector, dtype=np.float32)
        order = np.argsort(-scores, kind="stable")[:limit]
        hits = []
        for i in order:
            chunk = copy.deepcopy(candidates[int(i)])
            chunk.vector = []
            hits.append(ScoredChunk(chunk=chunk, score=float(scores[i]), scores=StageScores(dense=float(scores[i]))))
        return hits

    def search_bm25(self, query: str, expr: FilterExpr, limit: int) -> list[ScoredChunk]:
        raise NotImplementedError("the in-memory store has no server-side BM25; use the rank_bm25 backend")


class InMemoryDocumentRegistry:
    def __init__(self) -> None:
        self._docs: dict[str, DocumentRecord] = {}
        self._jobs: dict[str, IngestJobRecord] = {}
        self._lock = threading.Lock()

    def get(self, tenant: str, document_id: str) -> DocumentRecord | None:
        return self.get_many([f"{tenant}/{document_id}"]).get(f"{tenant}/{document_id}")

    def get_many(self, keys: list[str]) -> dict[str, DocumentRecord]:
        with self._lock:
            return {k: copy.deepcopy(self._docs[k]) for k in keys if k in self._docs}

    def put(self, record: DocumentRecord) -> None:
        record.updated_at = int(time.time())
        with self._lock:
            self._docs[record.key] = copy.deepcopy(record)

    def delete(self, tenant: str, document_id: str) -> None:
        with self._lock:
            self._docs.pop(f"{tenant}/{document_id}", None)

    def _all(self) -> list[DocumentRecord]:
        with self._lock:
            return [copy.deepcopy(d) for d in self._docs.values()]

    def find_by_hash(self, tenant: str, collection: str, content_hash: str) -> list[DocumentRecord]:
        return [
            d
            for d in self._all()
            if d.tenant == tenant and d.collection == collection and d.content_hash == content_hash
        ]

    def list_keys(self, expr: FilterExpr) -> list[str]:
        rows = [(d.key, {**dataclasses.asdict(d), "state": int(d.state), "doc_key": d.key}) for d in self._all()]
        return sorted(key for key, row in rows if expr.matches(row))

    def in_state(self, state: DocumentState) -> list[DocumentRecord]:
        return [d for d in self._all() if d.state == state]

    def changed_since(self, updated_after: int) -> list[DocumentRecord]:
        return [d for d in self._all() if d.updated_at > updated_after]

    def put_job(self, job: IngestJobRecord) -> None:
        job.updated_at = time.time()
        with self._lock:
            self._jobs[job.job_id] = copy.deepcopy(job)

    def get_job(self, job_id: str) -> IngestJobRecord | None:
        with self._lock:
            job = self._jobs.get(job_id)
            return copy.deepcopy(job) if job else None
