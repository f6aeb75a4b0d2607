"""Keeps the query service's in-process indexes (the BM25 index, and the dense vectors where
the query service searches them itself) in step with the shared collection, which another
process (the ingest service) writes.

A listener of the RegistryFollower: at start it indexes every chunk of the visible
generations (one paged scan of the chunk collection, with the vectors when the dense index is
held and each chunk's analysed BM25 terms where the collection keeps them, logged as it goes);
afterwards each batch of registry changes is applied by reading the changed generations' chunks
by primary key (ids derived from the generation and its recorded chunk span, ragrpc.models.chunk_id_for; a
key lookup, where a filter on the generation scans the whole collection on milvus-lite: 1.2-4 s
at 1M chunks), `_KEY_READ_BATCH` ids a call; a generation without a recorded span, or whose ids
did not find all its chunks, with one paged chunk query per `_RELOAD_BATCH` generations
(`generation in [...]`). Never one store call per document, never on the request path.
Removed documents leave the indexes at once. Both indexes share each chunk's attribute dict.
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
from query_service.packed_table import PackedTable
from query_service.registry_follower import DocumentChange, DocumentView
from query_service.sparse_index import IndexedChunk, InProcessBm25Index
from ragrpc.context_header import bm25_text
from ragrpc.models import ChunkKind, ChunkRecord, chunk_ids_of, document_key
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.store.base import ChunkStore
from ragrpc.store.metadata_fields import in_process_attributes
from ragrpc.store.milvus_chunks import chunk_to_row

logger = logging.getLogger(__name__)

_RELOAD_BATCH = 512  # generations in one `in` list (the filter builder allows 1024)
_KEY_READ_BATCH = 1024  # chunk ids in one read by primary key


# What the index keeps of a chunk: the fields filters test (schema.FILTERABLE_FIELDS, the
# filterable metadata keys) and those of a hit; the text and the rest of the row are read from
# the store for the final hits only (Retrieval._complete), so the index holds no copy of them.
_KEPT_FIELDS = (*s.FILTERABLE_FIELDS, s.CHUNKER)
_SHARED_FIELDS = (s.TENANT, s.COLLECTION, s.DOCUMENT_ID, s.GENERATION, s.SOURCE, s.MEDIA_TYPE, s.CHUNKER)


def indexed_chunk(chunk: ChunkRecord, *, context_headers: bool = False) -> IndexedChunk:
    """The chunk as the BM25 index holds it: its terms as the store keeps them (chunks schema 2), or its
    text to analyse (after its context header, built from the stored title and section path, when
    those are on), and the attributes that filters and hits need (its metadata under the field names
    of metadata keys, ragrpc.store.metadata_fields). Strings every chunk of a document repeats are
    interned, so a document's chunks share one copy."""
    row = chunk_to_row(chunk)
    attrs = {name: row[name] for name in _KEPT_FIELDS}
    for name in _SHARED_FIELDS:
        attrs[name] = sys.intern(attrs[name])
    # its metadata as plain attributes ("meta_<key>"), which a filter on a key the collection declares reads
    attrs.update(in_process_attributes(chunk.metadata))
    attrs[s.TAGS] = tuple(sys.intern(tag) for tag in attrs[s.TAGS])
    if chunk.bm25_terms is not None:  # analysed at ingestion (chunks schema 2): not again
        return IndexedChunk(chunk.chunk_id, "", attrs, chunk.bm25_terms)
    return IndexedChunk(chunk.chunk_id, bm25_text(chunk, context_headers=context_headers), attrs)


class _Held(NamedTuple):
    indexed: IndexedChunk
    vector: np.ndarray | None


class ChunkIndexSync:
    """A RegistryListener that fills the in-process indexes. A document whose chunk read returns fewer
    chunks than its registry record counts (a store that lags its own writes, a read cut short) is
    not applied: the index keeps its previous version and the follower tries again."""

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
        self._expected: dict[tuple[str, str], DocumentView] = {}  # documents seen while loading
        self._applied: PackedTable[tuple[str, int]] = PackedTable(APPLIED_CODEC)  # key -> (generation, chunks)
        self.loaded_chunks = 0

    @property
    def index(self) -> InProcessBm25Index:
        assert self._index is not None, "no BM25 index kept"
        return self._index

    @property
    def dense(self) -> InProcessDenseIndex:
        assert self._dense is not None, "no dense index kept"
        return self._dense

    @property
    def dense_index(self) -> InProcessDenseIndex | None:
        return self._dense

    @property
    def bm25_index(self) -> InProcessBm25Index | None:
        return self._index

    def documents(self) -> dict[str, tuple[str, int]]:
        """What the indexes hold: document key -> (generation, chunk count)."""
        return dict(self._applied.items())

    def export_state(self) -> dict[str, np.ndarray]:
        """What the indexes hold, as arrays for a snapshot (taken while no change is applied)."""
        return self._applied.export()

    def restore_state(self, applied: PackedTable[tuple[str, int]]) -> None:
        """What the indexes restored from a snapshot hold (PackedTable.restore of `export_state`)."""
        self._applied = applied

    def documents_loaded(self, documents: list[DocumentView]) -> None:
        self._expected.update(((v.tenant, v.document_id), v) for v in documents)

    def load_finished(self) -> set[str]:
        started = time.monotonic()
        documents = len(self._expected)
        loaded, short = self.load_chunks()
        seconds = time.monotonic() - started
        logger.info("%s loaded: %d chunks of %d documents in %.1fs", self._names(), loaded, documents, seconds)
        return short

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

    def load_chunks(self) -> tuple[int, set[str]]:
        """Indexes every retrievable chunk of the documents the follower loaded (one paged scan);
        returns the chunks indexed and the keys of the documents found short (not indexed). A document
        is indexed as soon as the scan has brought all its chunks, so what the scan holds at once is
        the documents it has seen part of, not the whole collection's chunks (at 1M chunks that was
        gigabytes of Python objects, whose heap stayed with the process after the load)."""
        grouped: dict[tuple[str, str], list[_Held]] = defaultdict(list)
        indexed: set[tuple[str, str]] = set()
        loaded, short = 0, set()
        scanned = pages = 0
        for page in self._scan(f.eq(s.KIND, int(ChunkKind.RETRIEVABLE))):
            for chunk, vector in zip(page, self._page_vectors(page), strict=True):
                key = (chunk.tenant, chunk.document_id)
                view = self._expected.get(key)
                if view is None or view.generation != chunk.generation:
                    continue
                if key in indexed:  # more chunks than the registry counts: read again, as a short one is
                    short.add(view.key)
                    continue
                items = grouped[key]
                items.append(_Held(indexed_chunk(chunk, context_headers=self._context_headers), vector))
                if len(items) >= view.chunk_count:
                    self._replace(view, items)
                    loaded += len(items)
                    indexed.add(key)
                    del grouped[key]
            scanned, pages = scanned + len(page), pages + 1
            if pages % 10 == 0:
                logger.info("%s: %d chunks scanned", self._names(), scanned)
        for key, view in self._expected.items():
            if key in indexed:
                if view.key in short:
                    logger.warning(
                        "document %s: the store returned more than its %d chunks", view.key, view.chunk_count
                    )
                    self._remove(*key)
                    loaded -= view.chunk_count
                continue
            items = grouped.pop(key, [])
            if len(items) >= view.chunk_count:  # a document without retrievable chunks
                self._replace(view, items)
                continue
            logger.warning(
                "document %s: the store returned %d of its %d chunks; loaded later",
                view.key,
                len(items),
                view.chunk_count,
            )
            short.add(view.key)
        grouped.clear()
        if self._dense is not None:
            self._dense.trim()  # no room left over from growing while loading
        _release_free_memory()
        self._expected.clear()
        self.loaded_chunks = loaded
        return loaded, short

    def _read_by_key(self, views: list[DocumentView]) -> dict[str, list[_Held]]:
        """The retrievable chunks of these generations, read by their derived ids, by generation."""
        grouped: dict[str, list[_Held]] = defaultdict(list)
        generations = {v.generation for v in views}
        ids = [i for v in views for i in chunk_ids_of(v.tenant, v.document_id, v.generation, v.chunk_span)]
        for start in range(0, len(ids), _KEY_READ_BATCH):
            page = self._chunks.get_chunks(
                ids[start : start + _KEY_READ_BATCH],
                with_vectors=self._dense is not None,
                with_bm25_terms=self._index is not None,
                index_fields_only=True,
            )
            page = [c for c in page if c.kind == ChunkKind.RETRIEVABLE and c.generation in generations]
            self._hold(page, grouped)
        return grouped

    def _hold(self, page: list[ChunkRecord], grouped: dict[str, list[_Held]]) -> None:
        for chunk, vector in zip(page, self._page_vectors(page), strict=True):
            grouped[chunk.generation].append(_Held(indexed_chunk(chunk, context_headers=self._context_headers), vector))

    def _page_vectors(self, page: list[ChunkRecord]) -> list[np.ndarray | None]:
        """The page's vectors as rows of one float32 matrix (not a list of floats, nor a small array,
        per chunk: one allocation a page, given back whole once its rows are copied into the index)."""
        if self._dense is None or not page:
            return [None] * len(page)
        matrix = np.asarray([chunk.vector for chunk in page], dtype=np.float32)
        for chunk in page:
            chunk.vector = []  # the row's list of floats goes now, not with the page
        return list(matrix)

    def _replace(self, view: DocumentView, held: list[_Held]) -> None:
        if self._index is not None:
            self._index.replace_document(view.tenant, view.document_id, [h.indexed for h in held])
        if self._dense is not None:
            vectors = [VectorChunk(h.indexed.chunk_id, h.vector, h.indexed.attrs) for h in held]  # type: ignore[arg-type]
            self._dense.replace_document(view.tenant, view.document_id, vectors)
        self._applied[view.key] = (view.generation, len(held))

    def _remove(self, tenant: str, document_id: str) -> None:
        if self._index is not None:
            self._index.remove_document(tenant, document_id)
        if self._dense is not None:
            self._dense.remove_document(tenant, document_id)
        self._applied.pop(document_key(tenant, document_id))

    def documents_changed(self, changes: list[DocumentChange]) -> set[str]:
        """Removals at once; the changed documents' chunks read by key, or with one paged query per
        `_RELOAD_BATCH` generations. Returns the keys of documents found short (left as they were)."""
        reload: dict[str, DocumentChange] = {}
        for change in changes:
            if change.now is None:
                self._remove(change.tenant, change.document_id)
            else:
                reload[change.now.generation] = change
        generations = list(reload)
        short: set[str] = set()
        for start in range(0, len(generations), _RELOAD_BATCH):
            short |= self._reload([reload[g] for g in generations[start : start + _RELOAD_BATCH]])
        return short

    def _reload(self, changes: list[DocumentChange]) -> set[str]:
        views = [c.now for c in changes if c.now is not None]
        grouped = self._read_by_key([v for v in views if v.chunk_span > 0])
        # no recorded span, or ids that did not find every chunk (written before ids were derived
        # so, or not yet visible on this replica): read by the generation filter, as before
        scanned = [v for v in views if v.chunk_span == 0 or len(grouped.get(v.generation, ())) < v.chunk_count]
        for view in scanned:
            grouped.pop(view.generation, None)
        if scanned:
            expr = f.and_(
                f.in_(s.GENERATION, [v.generation for v in scanned]), f.eq(s.KIND, int(ChunkKind.RETRIEVABLE))
            )
            for page in self._scan(expr):
                self._hold(page, grouped)
        short: set[str] = set()
        for change in changes:
            assert change.now is not None
            view = change.now
            found = grouped.get(view.generation, [])
            if len(found) < view.chunk_count and not change.accept_short:
                logger.warning(
                    "document %s: the store returned %d of the %d chunks of generation %s; keeping the "
                    "previous version until it returns them all",
                    view.key,
                    len(found),
                    view.chunk_count,
                    view.generation,
                )
                short.add(view.key)
                continue
            self._replace(view, found)
        return short


class _AppliedCodec:
    """(generation, chunk count) packed: the generation, then the count as 4 bytes."""

    def pack(self, value: tuple[str, int]) -> tuple[str, bytes]:
        generation, count = value
        return generation, int(count).to_bytes(4, "little")

    def unpack(self, key: str, generation: str, rest: bytes) -> tuple[str, int]:
        return generation, int.from_bytes(rest, "little")


APPLIED_CODEC = _AppliedCodec()


def _release_free_memory() -> None:
    """Hands the heap the start-up scan freed (its pages of rows) back to the system (glibc's
    malloc_trim; elsewhere nothing): without it the query service's RSS keeps them."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
