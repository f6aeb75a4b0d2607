"""In-memory ChunkStore and DocumentRegistry with the Milvus adapters' contracts and limits:
one query call returns at most MAX_QUERY_WINDOW rows (more is the adapters' InternalError),
scans come in pages of `page_size` in primary-key order, VARCHAR fields longer than the
schema allows fail the whole write (as milvus-lite does; nothing of the call is stored), and
an insert or upsert of an existing id replaces its row; the registry's `ensure_model` records
and checks the embedding identity as CollectionSetup.ensure does. tests/store_contract runs the
same suite against these and a real milvus-lite server."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from ragrpc.models import (
    ChunkRecord,
    DocumentRecord,
    DocumentState,
    IngestJobRecord,
    ScoredChunk,
    StageScores,
    WriterLeaseRecord,
)
from ragrpc.store import schema as s
from ragrpc.store.base import DocumentRegistry
from ragrpc.store.bm25_text import Bm25Text, stored_terms
from ragrpc.store.filters import FilterBuilder, FilterExpr
from ragrpc.store.metadata_fields import MetadataFields
from ragrpc.store.milvus_chunks import chunk_to_row, hit_to_chunk
from ragrpc.store.milvus_registry import record_to_row
from ragrpc.store.model_record import EmbeddingIdentity, ensure_recorded
from ragrpc.store.paging import DEFAULT_PAGE_SIZE, MAX_QUERY_WINDOW, checked_limit, checked_page_size

_REGISTRY_FILTER = FilterBuilder(s.REGISTRY_FILTERABLE_FIELDS)


def _check_lengths(row: dict, what: str) -> None:
    """A Milvus server refuses a VARCHAR value (or a tag of the VARCHAR array) longer than the field's
    max_length in UTF-8 bytes: the whole write fails, nothing of it stored, and the adapters report the
    refusal (translate_exception) - the same here."""
    for name, limit in (*s.VARCHAR_LIMITS.items(), (s.TAGS, s.MAX_TAG_LENGTH)):
        value = row.get(name)
        values = value if isinstance(value, list) else [value]
        for one in values:
            if isinstance(one, str) and s.utf8_length(one) > limit:
                from pymilvus.exceptions import MilvusException

                from ragrpc.store.milvus_connection import translate_exception

                raise translate_exception(
                    MilvusException(
                        code=1100,
                        message=f"the length ({s.utf8_length(one)}) of varchar field ({name}) exceeds max length "
                        f"({limit})",
                    ),
                    what,
                )


def _pages(items: list, page_size: int) -> Iterator[list]:
    for start in range(0, len(items), page_size):
        yield items[start : start + page_size]


class InMemoryChunkStore:
    """With `bm25_text`, it keeps each chunk's analysed BM25 terms as a collection of chunks schema 2
    does (and returns them from scan_chunks(with_bm25_terms=True)); without, as schema 1 (None)."""

    def __init__(
        self,
        supports_bm25: bool = False,
        upsert_keeps_partitions: bool = True,
        page_size: int = DEFAULT_PAGE_SIZE,
        bm25_text: Bm25Text | None = None,
        metadata_fields: MetadataFields | None = None,
    ) -> None:
        self._rows: dict[str, ChunkRecord] = {}
        # the metadata keys this "collection" filters on, each a field of its rows (ragrpc.store.metadata_fields)
        self._metadata_fields = metadata_fields or MetadataFields()
        self._bm25_text = bm25_text
        self._terms: dict[str, str] = {}  # chunk id -> its `bm25_text` field (with bm25_text)
        self._lock = threading.Lock()
        self._bm25 = supports_bm25
        self._upsert_ok = upsert_keeps_partitions
        self.page_size = checked_page_size(page_size)
        self.fail_next_insert: Exception | None = None  # fault injection for crash tests

    @property
    def supports_bm25(self) -> bool:
        return self._bm25

    @property
    def embedded(self) -> bool:
        return False  # like a Milvus server

    @property
    def searches_exactly_in_process(self) -> bool:
        return True  # numpy over every matching row: RAGRPC_DENSE_SEARCH=auto searches the store

    @property
    def upsert_keeps_partitions(self) -> bool:
        return self._upsert_ok

    @property
    def metadata_fields(self) -> MetadataFields:
        return self._metadata_fields

    def insert_chunks(self, chunks: list[ChunkRecord]) -> None:
        if self.fail_next_insert is not None:
            error, self.fail_next_insert = self.fail_next_insert, None
            raise error
        for chunk in chunks:
            _check_lengths(chunk_to_row(chunk, self._metadata_fields), "insert_chunks")
        terms = [self._bm25_text.document(c) for c in chunks] if self._bm25_text is not None else []
        with self._lock:
            for number, chunk in enumerate(chunks):
                self._rows[chunk.chunk_id] = copy.deepcopy(chunk)
                self._rows[chunk.chunk_id].bm25_terms = None  # derived by the store, never written
                if terms:
                    self._terms[chunk.chunk_id] = terms[number]

    def upsert_chunks(self, chunks: list[ChunkRecord]) -> None:
        self.insert_chunks(chunks)

    def _matching(self, expr: FilterExpr) -> list[ChunkRecord]:
        with self._lock:
            return [c for c in self._rows.values() if expr.matches(chunk_to_row(c, self._metadata_fields))]

    def delete_chunks(self, expr: FilterExpr) -> int:
        doomed = self._matching(expr)
        with self._lock:
            for chunk in doomed:
                self._rows.pop(chunk.chunk_id, None)
                self._terms.pop(chunk.chunk_id, None)
        return len(doomed)

    def count_chunks(self, expr: FilterExpr) -> int:
        return len(self._matching(expr))

    def query_chunks(
        self, expr: FilterExpr, limit: int = MAX_QUERY_WINDOW, with_vectors: bool = False
    ) -> list[ChunkRecord]:
        found = [copy.deepcopy(c) for c in self._matching(expr)[: checked_limit(limit, "query_chunks")]]
        return found if with_vectors else [_without_vector(c) for c in found]

    def get_chunks(
        self,
        chunk_ids: list[str],
        with_vectors: bool = False,
        with_bm25_terms: bool = False,
        index_fields_only: bool = False,
    ) -> list[ChunkRecord]:
        with self._lock:
            found = [copy.deepcopy(self._rows[i]) for i in dict.fromkeys(chunk_ids) if i in self._rows]
        if with_bm25_terms:
            self._with_terms(found, index_fields_only)
        return found if with_vectors else [_without_vector(c) for c in found]

    def _with_terms(self, copies: list[ChunkRecord], index_fields_only: bool) -> None:
        if self._bm25_text is None:
            return
        with self._lock:
            for chunk in copies:
                field = self._terms.get(chunk.chunk_id)
                chunk.bm25_terms = stored_terms(field) if field is not None else None
                if index_fields_only and field is not None:
                    _without_unindexed_fields(chunk)

    def scan_chunks(
        self,
        expr: FilterExpr,
        batch_size: int | None = None,
        with_vectors: bool = False,
        with_bm25_terms: bool = False,
        index_fields_only: bool = False,
    ) -> Iterator[list[ChunkRecord]]:
        found = sorted(self._matching(expr), key=lambda c: c.chunk_id)
        for page in _pages(found, checked_page_size(batch_size or self.page_size)):
            copies = [copy.deepcopy(c) for c in page]
            if with_bm25_terms:
                self._with_terms(copies, index_fields_only)
            yield copies if with_vectors else [_without_vector(c) for c in copies]

    def search_dense(self, vector: np.ndarray, expr: FilterExpr, limit: int, rows: bool = True) -> list[ScoredChunk]:
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
            if not rows:
                chunk = hit_to_chunk(chunk_to_row(chunk))
            score = float(scores[i])
            hits.append(ScoredChunk(chunk, score, StageScores(dense=score), complete=rows))
        return hits

    def search_bm25(self, query: str, expr: FilterExpr, limit: int) -> list[ScoredChunk]:
        raise NotImplementedError("the in-memory store has no server-side BM25; use the rank_bm25 backend")


def _without_vector(chunk: ChunkRecord) -> ChunkRecord:
    chunk.vector = []
    return chunk


def _without_unindexed_fields(chunk: ChunkRecord) -> None:
    """As the Milvus adapter returns a chunk whose schema.NOT_INDEXED_FIELDS it did not read."""
    chunk.text = chunk.title = chunk.content_hash = ""
    chunk.section_path = ()


class InMemoryDocumentRegistry:
    """`deletes_seen_after_s` > 0: a deleted row is still returned by keyed reads (get, get_many) for that
    long, as the sole writer's Session-consistency reads of a Milvus 2.3 server return it (measured: 40 of
    40 gets right after a delete by key still found the row; written rows are seen at once)."""

    def __init__(self, page_size: int = DEFAULT_PAGE_SIZE, deletes_seen_after_s: float = 0.0) -> None:
        self._deletes_seen_after_s = deletes_seen_after_s
        self._ghosts: dict[str, tuple[float, DocumentRecord]] = {}  # key -> (visible until, row deleted)
        self._docs: dict[str, DocumentRecord] = {}
        self._jobs: dict[str, IngestJobRecord] = {}
        self._deletions: dict[str, int] = {}  # document key -> deleted at (unix seconds)
        self._changes: dict[str, int] = {}  # document key -> last journalled change (unix seconds)
        self._lock = threading.Lock()
        self.page_size = checked_page_size(page_size)
        self.model_record: dict[str, Any] | None = None  # what CollectionSetup keeps under MODEL_INFO_KEY
        self._lease: WriterLeaseRecord | None = None

    def ensure_model(self, identity: EmbeddingIdentity, *, create: bool = True) -> None:
        """The embedding-model check of CollectionSetup.ensure: the first writer records its identity,
        a service with another provider, model or dimension is refused (ModelMismatchError)."""

        def write(record: dict[str, Any]) -> None:
            self.model_record = dict(record)

        with self._lock:
            ensure_recorded(lambda: self.model_record, write, identity, create=create)

    def get(self, tenant: str, document_id: str) -> DocumentRecord | None:
        return self.get_many([f"{tenant}/{document_id}"]).get(f"{tenant}/{document_id}")

    def get_many(self, keys: list[str]) -> dict[str, DocumentRecord]:
        now = time.monotonic()
        with self._lock:
            found = {k: copy.deepcopy(self._docs[k]) for k in keys if k in self._docs}
            for key in keys:
                ghost = self._ghosts.get(key)
                if key not in found and ghost is not None and ghost[0] > now:
                    found[key] = copy.deepcopy(ghost[1])
            return found

    def put(self, record: DocumentRecord) -> None:
        record.updated_at = int(time.time())
        _check_lengths(record_to_row(record), "put")
        with self._lock:
            self._docs[record.key] = copy.deepcopy(record)
            self._ghosts.pop(record.key, None)

    def delete(self, tenant: str, document_id: str) -> None:
        key = f"{tenant}/{document_id}"
        with self._lock:
            self._deletions[key] = int(time.time())
            deleted = self._docs.pop(key, None)
            if deleted is not None and self._deletes_seen_after_s > 0:
                self._ghosts[key] = (time.monotonic() + self._deletes_seen_after_s, deleted)

    def deleted_since(self, updated_after: int) -> Iterator[list[str]]:
        with self._lock:
            keys = [key for key, at in sorted(self._deletions.items()) if at > updated_after]
        yield from _pages(keys, self.page_size)

    def purge_deletions(self, older_than: int) -> None:
        with self._lock:
            self._deletions = {key: at for key, at in self._deletions.items() if at >= older_than}

    def journal_changes(self, keys: list[str]) -> None:
        now = int(time.time())
        with self._lock:
            for key in keys:
                self._changes[key] = now

    def changed_since(self, updated_after: int) -> Iterator[list[tuple[str, int]]]:
        with self._lock:
            entries = [(key, at) for key, at in sorted(self._changes.items()) if at > updated_after]
        yield from _pages(entries, self.page_size)

    def purge_changes(self, older_than: int) -> None:
        with self._lock:
            self._changes = {key: at for key, at in self._changes.items() if at >= older_than}

    def _matching(self, expr: FilterExpr) -> list[DocumentRecord]:
        with self._lock:
            return [copy.deepcopy(d) for _, d in sorted(self._docs.items()) if expr.matches(record_to_row(d))]

    def find_by_hash(self, tenant: str, collection: str, content_hash: str) -> list[DocumentRecord]:
        expr = _REGISTRY_FILTER.and_(
            _REGISTRY_FILTER.eq(s.TENANT, tenant),
            _REGISTRY_FILTER.eq(s.COLLECTION, collection),
            _REGISTRY_FILTER.eq(s.CONTENT_HASH, content_hash),
        )
        return self._matching(expr)

    def list_keys(self, expr: FilterExpr, *, after: str = "", limit: int) -> list[str]:
        keys = [d.key for d in self._matching(expr) if d.key > after]
        return keys[:limit]

    def scan_keys(self, expr: FilterExpr) -> Iterator[list[str]]:
        for page in self.scan(expr):
            yield [d.key for d in page]

    def scan(self, expr: FilterExpr) -> Iterator[list[DocumentRecord]]:
        yield from _pages(self._matching(expr), self.page_size)

    def put_job(self, job: IngestJobRecord) -> None:
        job.updated_at = time.time()
        with self._lock:
            self._jobs[job.job_id] = copy.deepcopy(job)

    def get_job(self, job_id: str) -> IngestJobRecord | None:
        with self._lock:
            job = self._jobs.get(job_id)
            return copy.deepcopy(job) if job else None

    def read_lease(self) -> WriterLeaseRecord | None:
        with self._lock:
            return copy.deepcopy(self._lease)

    def write_lease(self, lease: WriterLeaseRecord) -> None:
        with self._lock:
            self._lease = copy.deepcopy(lease)


def all_records(registry: DocumentRegistry, state: DocumentState | None = None) -> list[DocumentRecord]:
    """Every document of a registry (paged through), optionally in one state: for tests and checks."""
    expr = _REGISTRY_FILTER.gte(s.STATE, 0) if state is None else _REGISTRY_FILTER.eq(s.STATE, int(state))
    return [record for page in registry.scan(expr) for record in page]


def all_keys(registry: DocumentRegistry, expr: FilterExpr) -> list[str]:
    return [key for page in registry.scan_keys(expr) for key in page]
