"""MilvusChunkStore: chunk rows with dense vectors (and server-side BM25 where supported)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ragrpc import errors
from ragrpc.analyzer import EnglishAnalyzer
from ragrpc.models import ChunkKind, ChunkRecord, ScoredChunk, StageScores
from ragrpc.store import schema as s
from ragrpc.store.bm25_text import Bm25Text, stored_terms
from ragrpc.store.collections import CollectionNames, CollectionSetup, IndexConfig
from ragrpc.store.filters import FilterExpr
from ragrpc.store.metadata_fields import MetadataFields
from ragrpc.store.milvus_connection import MilvusConnection, translate_errors
from ragrpc.store.paging import DEFAULT_PAGE_SIZE, MAX_QUERY_WINDOW, checked_limit, checked_page_size, scan_rows

logger = logging.getLogger(__name__)

_INSERT_BATCH = 512


def chunk_to_row(chunk: ChunkRecord, metadata_fields: MetadataFields | None = None) -> dict[str, Any]:
    """The chunk's row; with `metadata_fields` (the collection's), with the fields of its declared metadata
    keys (InvalidInputError naming a key whose value is longer than its field)."""
    row = {
        s.CHUNK_ID: chunk.chunk_id,
        s.TENANT: chunk.tenant,
        s.COLLECTION: chunk.collection,
        s.DOCUMENT_ID: chunk.document_id,
        s.GENERATION: chunk.generation,
        s.TEXT: chunk.text,
        s.SOURCE: s.clip_utf8(chunk.source, s.VARCHAR_LIMITS[s.SOURCE]),
        s.TITLE: s.clip_utf8(chunk.title, s.VARCHAR_LIMITS[s.TITLE]),
        s.MEDIA_TYPE: chunk.media_type,
        s.PAGE_START: chunk.page_start,
        s.PAGE_END: chunk.page_end,
        s.SECTION_PATH: s.clip_utf8(s.SECTION_SEPARATOR.join(chunk.section_path), s.VARCHAR_LIMITS[s.SECTION_PATH]),
        s.CHUNK_INDEX: chunk.chunk_index,
        s.CHUNKER: chunk.chunker,
        s.KIND: int(chunk.kind),
        s.PARENT_ID: chunk.parent_id,
        s.CONTENT_HASH: chunk.content_hash,
        s.TAGS: [s.clip_utf8(t, s.MAX_TAG_LENGTH) for t in chunk.tags[: s.MAX_TAGS]],
        s.DOC_DATE: chunk.doc_date,
        s.CREATED_AT: chunk.created_at,
        s.METADATA: chunk.metadata,
        s.DENSE: list(map(float, chunk.vector)),
    }
    if metadata_fields is not None and metadata_fields.keys:
        row.update(metadata_fields.row_values(chunk.metadata))
    return row


def hit_to_chunk(row: Mapping[str, Any]) -> ChunkRecord:
    """A chunk of which only schema.HIT_FIELDS were read."""
    entity = row.get("entity", row)
    return ChunkRecord(
        chunk_id=entity[s.CHUNK_ID],
        document_id=entity[s.DOCUMENT_ID],
        tenant=entity[s.TENANT],
        collection=entity[s.COLLECTION],
        generation=entity[s.GENERATION],
        text="",
        vector=[],
        chunk_index=int(entity[s.CHUNK_INDEX]),
        chunker=entity[s.CHUNKER],
        kind=ChunkKind(int(entity[s.KIND])),
    )


def row_to_chunk(row: dict[str, Any]) -> ChunkRecord:
    entity = row.get("entity", row)
    section = entity.get(s.SECTION_PATH) or ""
    vector = entity.get(s.DENSE)
    return ChunkRecord(
        chunk_id=entity[s.CHUNK_ID],
        document_id=entity[s.DOCUMENT_ID],
        tenant=entity[s.TENANT],
        collection=entity[s.COLLECTION],
        generation=entity[s.GENERATION],
        text=entity.get(s.TEXT, ""),  # absent from scans for an index (scan_chunks' index_fields_only)
        vector=list(vector) if vector is not None else [],
        chunk_index=int(entity[s.CHUNK_INDEX]),
        chunker=entity[s.CHUNKER],
        source=entity[s.SOURCE],
        title=entity.get(s.TITLE, ""),
        media_type=entity[s.MEDIA_TYPE],
        page_start=int(entity[s.PAGE_START]),
        page_end=int(entity[s.PAGE_END]),
        section_path=tuple(section.split(s.SECTION_SEPARATOR)) if section else (),
        kind=ChunkKind(int(entity[s.KIND])),
        parent_id=entity[s.PARENT_ID],
        content_hash=entity.get(s.CONTENT_HASH, ""),
        tags=tuple(entity.get(s.TAGS) or ()),
        doc_date=int(entity[s.DOC_DATE]),
        created_at=int(entity[s.CREATED_AT]),
        metadata=dict(entity.get(s.METADATA) or {}),
    )


class MilvusChunkStore:
    """ChunkStore over the `<prefix>_chunks` collection."""

    def __init__(
        self,
        connection: MilvusConnection,
        names: CollectionNames,
        index: IndexConfig,
        setup: CollectionSetup,
        page_size: int = DEFAULT_PAGE_SIZE,
        bm25_text: Bm25Text | None = None,
        key_scan_from_rows: int | None = None,
    ) -> None:
        """key_scan_from_rows: scans of a collection of at least this many rows read the matching keys,
        then the rows by key (milvus-lite, see ragrpc.store.paging); None: never."""
        self._conn = connection
        self._names = names
        self._index = index
        self._setup = setup
        self.page_size = checked_page_size(page_size)
        self._bm25_text = bm25_text or Bm25Text(EnglishAnalyzer())
        self.key_scan_from_rows = key_scan_from_rows

    @property
    def supports_bm25(self) -> bool:
        return self._setup.bm25_supported

    @property
    def embedded(self) -> bool:
        return self._setup.embedded

    @property
    def searches_exactly_in_process(self) -> bool:
        return False

    @property
    def stores_analysed_terms(self) -> bool:
        """Whether each row keeps its chunk's analysed BM25 terms (chunks schema 2, ragrpc.store.bm25_text):
        then a chunk that comes with them (`ChunkRecord.bm25_terms`) is written with those."""
        return self._setup.bm25_analysed

    @property
    def upsert_keeps_partitions(self) -> bool:
        return self._setup.upsert_keeps_partitions

    def _write(self, operation: str, rows: list[dict[str, Any]]) -> None:
        self._conn.write_rows(operation, self._names.chunks, rows, s.CHUNK_ID)

    @property
    def metadata_fields(self) -> MetadataFields:
        """The metadata keys the collection filters on (known once the setup's `ensure` ran)."""
        return self._setup.metadata_fields

    def rows_for_insert(self, chunks: list[ChunkRecord]) -> list[dict[str, Any]]:
        """The rows `insert_chunks` sends for these chunks (benches time the store's insert alone)."""
        return self._rows(chunks)

    def _rows(self, chunks: list[ChunkRecord]) -> list[dict[str, Any]]:
        rows = [chunk_to_row(c, self._setup.metadata_fields) for c in chunks]
        if self._setup.bm25_analysed:
            for row, chunk in zip(rows, chunks, strict=True):
                row[s.BM25_TEXT] = self._bm25_text.document(chunk)
        return rows

    @translate_errors
    def insert_chunks(self, chunks: list[ChunkRecord]) -> None:
        for start in range(0, len(chunks), _INSERT_BATCH):
            self._write("insert", self._rows(chunks[start : start + _INSERT_BATCH]))

    @translate_errors
    def upsert_chunks(self, chunks: list[ChunkRecord]) -> None:
        for start in range(0, len(chunks), _INSERT_BATCH):
            self._write("upsert", self._rows(chunks[start : start + _INSERT_BATCH]))

    @translate_errors
    def delete_chunks(self, expr: FilterExpr) -> int:
        result = self._conn.write(lambda c: c.delete(self._names.chunks, filter=expr.render()))
        return int(result.get("delete_count", 0)) if isinstance(result, dict) else 0

    @translate_errors
    def count_chunks(self, expr: FilterExpr) -> int:
        rows = self._conn.call(lambda c: c.query(self._names.chunks, filter=expr.render(), output_fields=["count(*)"]))
        return int(rows[0]["count(*)"]) if rows else 0

    @translate_errors
    def query_chunks(
        self, expr: FilterExpr, limit: int = MAX_QUERY_WINDOW, with_vectors: bool = False
    ) -> list[ChunkRecord]:
        """At most `limit` (<= MAX_QUERY_WINDOW) chunks matching expr, in no particular order: for
        reads whose size the caller knows (chunks by id). Everything else scans."""
        fields = list(s.CHUNK_OUTPUT_FIELDS) + ([s.DENSE] if with_vectors else [])
        window = checked_limit(limit, "query_chunks")
        rows = self._conn.call(
            lambda c: c.query(self._names.chunks, filter=expr.render(), output_fields=fields, limit=window)
        )
        return [row_to_chunk(r) for r in rows]

    @translate_errors
    def get_chunks(
        self,
        chunk_ids: list[str],
        with_vectors: bool = False,
        with_bm25_terms: bool = False,
        index_fields_only: bool = False,
    ) -> list[ChunkRecord]:
        """The chunks with these ids that exist, read by primary key (a key lookup, where a filter on
        another field scans the collection: 5 vs 272 ms for 10 rows of 100k on milvus-lite)."""
        if not chunk_ids:
            return []
        fields, terms = self._read_fields(with_vectors, with_bm25_terms, index_fields_only)
        rows = self._conn.get_rows(self._names.chunks, list(chunk_ids), fields, s.CHUNK_ID)
        return self._chunks_of(rows, terms)

    def _read_fields(
        self, with_vectors: bool, with_bm25_terms: bool, index_fields_only: bool
    ) -> tuple[list[str], bool]:
        """The fields a read asks for, and whether they include the stored BM25 terms."""
        terms = with_bm25_terms and self._setup.bm25_analysed
        skipped = s.NOT_INDEXED_FIELDS if terms and index_fields_only else ()
        fields = [name for name in s.CHUNK_OUTPUT_FIELDS if name not in skipped]
        return fields + ([s.DENSE] if with_vectors else []) + ([s.BM25_TEXT] if terms else []), terms

    @staticmethod
    def _chunks_of(rows: list[dict[str, Any]], terms: bool) -> list[ChunkRecord]:
        chunks = [row_to_chunk(r) for r in rows]
        if terms:
            for chunk, row in zip(chunks, rows, strict=True):
                chunk.bm25_terms = stored_terms(row.get("entity", row)[s.BM25_TEXT])
        return chunks

    def scan_chunks(
        self,
        expr: FilterExpr,
        batch_size: int | None = None,
        with_vectors: bool = False,
        with_bm25_terms: bool = False,
        index_fields_only: bool = False,
    ) -> Iterator[list[ChunkRecord]]:
        """All chunks matching expr, in pages of the store's page size (or batch_size), in chunk-id order.
        with_bm25_terms: each chunk's stored BM25 terms (`ChunkRecord.bm25_terms`) where the collection
        keeps them (chunks schema 2); index_fields_only: then without schema.NOT_INDEXED_FIELDS."""
        fields, terms = self._read_fields(with_vectors, with_bm25_terms, index_fields_only)
        for rows in scan_rows(
            self._conn,
            self._names.chunks,
            expr,
            fields,
            page_size=batch_size or self.page_size,
            operation="scan_chunks",
            by_key=s.CHUNK_ID if self.key_scan_from_rows is not None else "",
            by_key_from_rows=self.key_scan_from_rows or 0,
        ):
            yield self._chunks_of(rows, terms)

    @translate_errors
    def search_dense(self, vector: np.ndarray, expr: FilterExpr, limit: int, rows: bool = True) -> list[ScoredChunk]:
        """Top `limit` by cosine; with rows=False only the hit fields are read (complete=False hits)."""
        params = self._index.search_params(limit)
        result = self._conn.call(
            lambda c: c.search(
                self._names.chunks,
                data=[np.asarray(vector, dtype=np.float32).tolist()],
                anns_field=s.DENSE,
                filter=expr.render(),
                limit=limit,
                output_fields=list(s.CHUNK_OUTPUT_FIELDS if rows else s.HIT_FIELDS),
                search_params=params,
            )
        )
        convert = row_to_chunk if rows else hit_to_chunk
        hits: list[ScoredChunk] = []
        for hit in result[0] if result else []:
            score = float(hit["distance"])
            hits.append(ScoredChunk(convert(hit), score, StageScores(dense=score), complete=rows))
        return hits

    @translate_errors
    def search_bm25(self, query: str, expr: FilterExpr, limit: int) -> list[ScoredChunk]:
        if not self.supports_bm25:
            raise errors.PreconditionError(
                "this Milvus server has no BM25 function (Milvus < 2.5); set RAGRPC_SPARSE_BACKEND=rank_bm25",
                reason="BM25_UNSUPPORTED",
            )
        if self._setup.bm25_analysed:
            query = self._bm25_text.query(query)
            if not query:
                return []  # only stop words or punctuation: no term to score
        result = self._conn.call(
            lambda c: c.search(
                self._names.chunks,
                data=[query],
                anns_field=s.SPARSE,
                filter=expr.render(),
                limit=limit,
                output_fields=list(s.CHUNK_OUTPUT_FIELDS),
                search_params={"metric_type": "BM25"},
            )
        )
        hits: list[ScoredChunk] = []
        for hit in result[0] if result else []:
            # milvus-lite reports BM25 as a negative distance; Milvus proper as a positive score.
            score = abs(float(hit["distance"]))
            hits.append(ScoredChunk(chunk=row_to_chunk(hit), score=score, scores=StageScores(sparse=score)))
        return hits
