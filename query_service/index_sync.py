"""Keeps the query service's in-process indexes (the BM25 index, and the dense vectors where
the query service searches them itself) in step with the shared collection, which another
process (the ingest service) writes.

A listener of the RegistryFollower: at start it indexes every chunk of the visible
generations (one paged scan of the chunk collection, with the vectors when the dense index is
held and each chunk's analysed BM25 terms where the collection keeps them, logged as it goes);
afterwards each batch of registry changes is applied with one paged chunk query per
`_RELOAD_BATCH` generations (`generation in [...]`), never one store call per document, and
never on the request path. Removed documents leave the indexes at once. Both indexes share each
chunk's attribute dict.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from query_service.dense_index import InProcessDenseIndex, VectorChunk
from query_service.registry_follower import DocumentChange, DocumentView
from query_service.sparse_index import IndexedChunk, InProcessBm25Index
from ragrpc.context_header import bm25_text
from ragrpc.models import ChunkKind, ChunkRecord
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.store.base import ChunkStore
from ragrpc.store.milvus_chunks import chunk_to_row

logger = logging.getLogger(__name__)

_RELOAD_BATCH = 512  # generations in one `in` list (the filter builder allows 1024)


# What the index keeps of a chunk: the fields filters test (schema.FILTERABLE_FIELDS, the
# filterable metadata keys) and those of a hit; the text and the rest of the row are read from
# the store for the final hits only (Retrieval._complete), so the index holds no copy of them.
_KEPT_FIELDS = (*s.FILTERABLE_FIELDS, s.CHUNKER)
_SHARED_FIELDS = (s.TENANT, s.COLLECTION, s.DOCUMENT_ID, s.GENERATION, s.SOURCE, s.MEDIA_TYPE, s.CHUNKER)


def indexed_chunk(chunk: ChunkRecord, *, context_headers: bool = False) -> IndexedChunk:
    """The chunk as the BM25 index holds it: its terms as the store keeps them (chunks schema 2), or its
    text to analyse (after its context header, built from the stored title and section path, when
    those are on), and the attributes that filters and hits need. Strings every chunk of a
    document repeats are interned, so a document's chunks share one copy."""
    row = chunk_to_row(chunk)
    attrs = {name: row[name] for name in _KEPT_FIELDS}
    for name in _SHARED_FIELDS:
        attrs[name] = sys.intern(attrs[name])
    facts = {key: chunk.metadata[key] for key in s.FILTERABLE_METADATA_KEYS if key in chunk.metadata}
    if facts:
        attrs[s.METADATA] = facts
    attrs[s.TAGS] = tuple(sys.intern(tag) for tag in attrs[s.TAGS])
    if chunk.bm25_terms is not None:  # analysed at ingestion (chunks schema 2): not again
        return IndexedChunk(chunk.chunk_id, "", attrs, chunk.bm25_terms)
    return IndexedChunk(chunk.chunk_id, bm25_text(chunk, context_headers=context_headers), attrs)


class _Held(NamedTuple):
    indexed: IndexedChunk
    vector: np.ndarray | None


class ChunkIndexSync:
    def __init__(
        self,
        index: InProcessBm25Index | None,
        chunks: ChunkStore,
        *,
        context_headers: bool = False,
        dense: InProcessDenseIndex | None = None,
    ) -> None:
        if index is None and dense is None:
            raise ValueError("ChunkIndexSync needs an index to keep")
        self._context_headers = context_headers
        self._index = index
        self._dense = dense
        self._chunks = chunks
        self._expected: dict[tuple[str, str], str] = {}  # documents seen while loading -> generation
        self.loaded_chunks = 0

    @property
    def index(self) -> InProcessBm25Index:
        assert self._index is not None, "no BM25 index kept"
        return self._index

    @property
    def dense(self) -> InProcessDenseIndex:
        assert self._dense is not None, "no dense index kept"
        return self._dense

    def documents_loaded(self, documents: list[DocumentView]) -> None:
        self._expected.update(((v.tenant, v.document_id), v.generation) for v in documents)

    def load_finished(self) -> None:
        started = time.monotonic()
        documents = len(self._expected)
        loaded = self.load_chunks()
        seconds = time.monotonic() - started
        logger.info("%s loaded: %d chunks of %d documents in %.1fs", self._names(), loaded, documents, seconds)

    def _names(self) -> str:
        kept = (("rank_bm25 index", self._index), ("dense vectors", self._dense))
        return " and ".join(name for name, index in kept if index is not None)

    def _scan(self, expr: f.FilterExpr) -> Iterator[list[ChunkRecord]]:
        return self._chunks.scan_chunks(
            expr,
            with_vectors=self._dense is not None,
            with_bm25_terms=self._index is not None,
            index_fields_only=True,  # a chunk that comes with its stored terms needs no text here
        )

    def load_chunks(self) -> int:
        """Indexes every retrievable chunk of the documents the follower loaded (one paged scan)."""
        grouped: dict[tuple[str, str], list[_Held]] = defaultdict(list)
        scanned = pages = 0
        for page in self._scan(f.eq(s.KIND, int(ChunkKind.RETRIEVABLE))):
            for chunk, vector in zip(page, self._page_vectors(page), strict=True):
                key = (chunk.tenant, chunk.document_id)
                if self._expected.get(key) == chunk.generation:
                    grouped[key].append(_Held(indexed_chunk(chunk, context_headers=self._context_headers), vector))
            scanned, pages = scanned + len(page), pages + 1
            if pages % 10 == 0:
                logger.info("%s: %d chunks scanned", self._names(), scanned)
        loaded = 0
        for (tenant, document_id), items in grouped.items():
            self._replace(tenant, document_id, items)
            loaded += len(items)
        grouped.clear()
        if self._dense is not None:
            self._dense.trim()  # no room left over from growing while loading
        _release_free_memory()
        self._expected.clear()
        self.loaded_chunks = loaded
        return loaded

    def _page_vectors(self, page: list[ChunkRecord]) -> list[np.ndarray | None]:
        """The page's vectors as rows of one float32 matrix (not a list of floats, nor a small array,
        per chunk: one allocation a page, given back whole once its rows are copied into the index)."""
        if self._dense is None or not page:
            return [None] * len(page)
        matrix = np.asarray([chunk.vector for chunk in page], dtype=np.float32)
        for chunk in page:
            chunk.vector = []  # the row's list of floats goes now, not with the page
        return list(matrix)

    def _replace(self, tenant: str, document_id: str, held: list[_Held]) -> None:
        if self._index is not None:
            self._index.replace_document(tenant, document_id, [h.indexed for h in held])
        if self._dense is not None:
            vectors = [VectorChunk(h.indexed.chunk_id, h.vector, h.indexed.attrs) for h in held]  # type: ignore[arg-type]
            self._dense.replace_document(tenant, document_id, vectors)

    def documents_changed(self, changes: list[DocumentChange]) -> None:
        reload: dict[str, DocumentView] = {}
        for change in changes:
            if change.now is None:
                if self._index is not None:
                    self._index.remove_document(change.tenant, change.document_id)
                if self._dense is not None:
                    self._dense.remove_document(change.tenant, change.document_id)
            else:
                reload[change.now.generation] = change.now
        generations = list(reload)
        for start in range(0, len(generations), _RELOAD_BATCH):
            self._reload([reload[g] for g in generations[start : start + _RELOAD_BATCH]])

    def _reload(self, documents: list[DocumentView]) -> None:
        expr = f.and_(f.in_(s.GENERATION, [d.generation for d in documents]), f.eq(s.KIND, int(ChunkKind.RETRIEVABLE)))
        grouped: dict[str, list[_Held]] = defaultdict(list)
        for page in self._scan(expr):
            for chunk, vector in zip(page, self._page_vectors(page), strict=True):
                held = _Held(indexed_chunk(chunk, context_headers=self._context_headers), vector)
                grouped[chunk.generation].append(held)
        for document in documents:
            self._replace(document.tenant, document.document_id, grouped.get(document.generation, []))


def _release_free_memory() -> None:
    """Hands the heap the start-up scan freed (its pages of rows) back to the system (glibc's
    malloc_trim; elsewhere nothing): without it the query service's RSS keeps them."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
