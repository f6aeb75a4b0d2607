"""Keeps the query service's in-process BM25 index in step with the shared collection, which
another process (the ingest service) writes.

The registry says which generation of every document is current. `refresh()` asks it for
documents changed since the last look (a cheap query on `updated_at`), loads the chunks of
new generations and drops replaced, failed and deleted ones; it is incremental, never a
rebuild per query. Deleted documents leave no registry row, so a periodic reconcile
compares the indexed documents with the registry's keys. Queries additionally pass through
the pipeline's visibility check, so a document deleted a moment ago never surfaces.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable

from query_service.sparse_index import IndexedChunk, InProcessBm25Index
from ragrpc.models import ChunkKind, ChunkRecord, DocumentRecord, DocumentState
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.store.base import ChunkStore, DocumentRegistry
from ragrpc.store.filters import FilterBuilder
from ragrpc.store.milvus_chunks import chunk_to_row

logger = logging.getLogger(__name__)

_REGISTRY = FilterBuilder(s.REGISTRY_FILTERABLE_FIELDS)
_CLOCK_SLACK_S = 2  # updated_at has 1 s resolution and clocks of two processes differ


def indexed_chunk(chunk: ChunkRecord) -> IndexedChunk:
    row = chunk_to_row(chunk)
    row.pop(s.DENSE, None)
    return IndexedChunk(chunk.chunk_id, chunk.text, row)


class SparseIndexSync:
    def __init__(
        self,
        index: InProcessBm25Index,
        registry: DocumentRegistry,
        chunks: ChunkStore,
        *,
        min_interval_s: float = 0.0,
        reconcile_interval_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._index = index
        self._registry = registry
        self._chunks = chunks
        self._min_interval = min_interval_s
        self._reconcile_interval = reconcile_interval_s
        self._clock = clock
        self._watermark = 0  # registry updated_at seen so far
        self._generations: dict[tuple[str, str], str] = {}  # (tenant, document_id) -> indexed generation
        self._fields: dict[tuple[str, str], tuple] = {}  # ... -> title/tags/metadata the indexed chunks carry
        self._last_refresh = float("-inf")
        self._last_reconcile = float("-inf")
        self._lock = threading.Lock()

    def load_all(self) -> int:
        """Initial load: every current chunk, scanned in batches (one pass over the collection)."""
        with self._lock:
            active = self._active_documents()
            current = {(r.tenant, r.document_id): r.generation for r in active}
            self._fields.update({(r.tenant, r.document_id): _chunk_fields(r) for r in active})
            grouped: dict[tuple[str, str], list[IndexedChunk]] = defaultdict(list)
            for batch in self._chunks.scan_chunks(f.eq(s.KIND, int(ChunkKind.RETRIEVABLE))):
                for chunk in batch:
                    key = (chunk.tenant, chunk.document_id)
                    if current.get(key) == chunk.generation:
                        grouped[key].append(indexed_chunk(chunk))
            for (tenant, document_id), items in grouped.items():
                self._index.replace_document(tenant, document_id, items)
                self._generations[(tenant, document_id)] = current[(tenant, document_id)]
            self._last_refresh = self._last_reconcile = self._clock()
            return sum(len(v) for v in grouped.values())

    def _active_documents(self) -> list[DocumentRecord]:
        records = self._registry.in_state(DocumentState.ACTIVE)
        if records:
            self._watermark = max(self._watermark, max(r.updated_at for r in records))
        return [r for r in records if r.generation and not r.deleting]

    def refresh(self, force: bool = False) -> None:
        """Applies registry changes since the last call (at most every min_interval_s)."""
        with self._lock:
            now = self._clock()
            if not force and now - self._last_refresh < self._min_interval:
                return
            self._last_refresh = now
            changed = self._registry.changed_since(max(0, self._watermark - _CLOCK_SLACK_S))
            for record in changed:
                self._apply(record)
                self._watermark = max(self._watermark, record.updated_at)
            if force or now - self._last_reconcile >= self._reconcile_interval:
                self._reconcile()
                self._last_reconcile = now

    def _apply(self, record: DocumentRecord) -> None:
        key = (record.tenant, record.document_id)
        visible = record.generation if not record.deleting else ""
        fields = _chunk_fields(record)
        if self._generations.get(key, "") == visible and (not visible or self._fields.get(key) == fields):
            return  # (UpdateDocument changes title/tags/metadata on the chunks of the same generation)
        if not visible:
            self._index.remove_document(*key)
            self._generations.pop(key, None)
            self._fields.pop(key, None)
            return
        expr = f.and_(
            f.eq(s.TENANT, record.tenant),
            f.eq(s.DOCUMENT_ID, record.document_id),
            f.eq(s.GENERATION, visible),
            f.eq(s.KIND, int(ChunkKind.RETRIEVABLE)),
        )
        items = [indexed_chunk(c) for batch in self._chunks.scan_chunks(expr) for c in batch]
        self._index.replace_document(record.tenant, record.document_id, items)
        self._generations[key] = visible
        self._fields[key] = fields

    def _reconcile(self) -> None:
        keys = set(self._registry.list_keys(_REGISTRY.gte(s.STATE, 1)))
        for tenant, document_id in list(self._generations):
            if f"{tenant}/{document_id}" not in keys:
                self._index.remove_document(tenant, document_id)
                self._generations.pop((tenant, document_id), None)
                self._fields.pop((tenant, document_id), None)

    @property
    def indexed_documents(self) -> int:
        return len(self._generations)


def _chunk_fields(record: DocumentRecord) -> tuple:
    """The document-level fields copied onto every chunk (filters on them run inside the index)."""
    return (record.title, tuple(record.tags), tuple(sorted((str(k), str(v)) for k, v in record.metadata.items())))
