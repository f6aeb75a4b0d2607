"""Store interfaces. MilvusChunkStore / MilvusDocumentRegistry implement them for Milvus;
ragrpc.testing has in-memory versions with the same contract."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import numpy as np

from ragrpc.models import ChunkRecord, DocumentRecord, IngestJobRecord, ScoredChunk, WriterLeaseRecord
from ragrpc.store.filters import FilterExpr
from ragrpc.store.metadata_fields import MetadataFields


class ChunkStore(Protocol):
    """Chunks with their vectors. `expr` arguments are FilterExpr trees from
    ragrpc.store.filters (never hand-built strings); the store renders them."""

    @property
    def supports_bm25(self) -> bool: ...

    @property
    def embedded(self) -> bool:
        """True for milvus-lite (an embedded store whose own vector search is slow at scale)."""
        ...

    @property
    def searches_exactly_in_process(self) -> bool:
        """True where the store's own dense search is already exact and runs in this process (the
        in-memory store): a copy of its vectors in the query service would gain nothing."""
        ...

    @property
    def upsert_keeps_partitions(self) -> bool:
        """False where upserted rows leave their tenant partition (Milvus 2.3): update by new generation."""
        ...

    @property
    def metadata_fields(self) -> MetadataFields:
        """The metadata keys the collection filters on, each a field of its rows (ragrpc.store.metadata_fields)."""
        ...

    def insert_chunks(self, chunks: list[ChunkRecord]) -> None: ...

    def upsert_chunks(self, chunks: list[ChunkRecord]) -> None: ...

    def delete_chunks(self, expr: FilterExpr) -> int: ...

    def count_chunks(self, expr: FilterExpr) -> int: ...

    def query_chunks(self, expr: FilterExpr, limit: int, with_vectors: bool = False) -> list[ChunkRecord]:
        """At most `limit` matching chunks, limit <= MAX_QUERY_WINDOW (more is InternalError): for reads
        whose size the caller knows, such as chunks by id."""
        ...

    def get_chunks(
        self,
        chunk_ids: list[str],
        with_vectors: bool = False,
        with_bm25_terms: bool = False,
        index_fields_only: bool = False,
    ) -> list[ChunkRecord]:
        """The chunks with these ids that exist, read by primary key (any tenant: callers check it);
        with_bm25_terms and index_fields_only as for scan_chunks."""
        ...

    def scan_chunks(
        self,
        expr: FilterExpr,
        batch_size: int | None = None,
        with_vectors: bool = False,
        with_bm25_terms: bool = False,
        index_fields_only: bool = False,
    ) -> Iterator[list[ChunkRecord]]:
        """Every matching chunk, in pages (the store's page size unless batch_size), in chunk-id order;
        with_bm25_terms: with `bm25_terms` where the store keeps each chunk's analysed terms (else None);
        index_fields_only (with with_bm25_terms): a chunk that comes with its terms comes without the
        fields no in-process index keeps (schema.NOT_INDEXED_FIELDS, left empty), which are not read."""
        ...

    def search_dense(self, vector: np.ndarray, expr: FilterExpr, limit: int, rows: bool = True) -> list[ScoredChunk]:
        """Top `limit` by cosine; rows=False reads only schema.HIT_FIELDS (hits with complete=False)."""
        ...

    def search_bm25(self, query: str, expr: FilterExpr, limit: int) -> list[ScoredChunk]: ...


class DocumentRegistry(Protocol):
    """The document registry and ingestion jobs."""

    def get(self, tenant: str, document_id: str) -> DocumentRecord | None: ...

    def get_many(self, keys: list[str]) -> dict[str, DocumentRecord]: ...

    def put(self, record: DocumentRecord) -> None: ...

    def delete(self, tenant: str, document_id: str) -> None:
        """Removes the document's row and journals the delete (deleted_since)."""
        ...

    def deleted_since(self, updated_after: int) -> Iterator[list[str]]:
        """Keys of documents deleted after `updated_after` (unix seconds), in pages."""
        ...

    def purge_deletions(self, older_than: int) -> None:
        """Drops deletion-journal entries older than `older_than` (unix seconds)."""
        ...

    def journal_changes(self, keys: list[str]) -> None:
        """Records that these documents' rows changed, for followers (changed_since); the writer calls
        it after each put (ingest_service.change_journal)."""
        ...

    def changed_since(self, updated_after: int) -> Iterator[list[tuple[str, int]]]:
        """(key, unix seconds) of the documents journalled as changed after `updated_after`, in pages."""
        ...

    def purge_changes(self, older_than: int) -> None:
        """Drops change-journal entries older than `older_than` (unix seconds)."""
        ...

    def find_by_hash(self, tenant: str, collection: str, content_hash: str) -> list[DocumentRecord]: ...

    def list_keys(self, expr: FilterExpr, *, after: str = "", limit: int) -> list[str]:
        """The first `limit` keys matching expr that sort after `after`, in key order (keyset paging)."""
        ...

    def scan_keys(self, expr: FilterExpr) -> Iterator[list[str]]:
        """Every key matching expr, in pages, in key order."""
        ...

    def scan(self, expr: FilterExpr) -> Iterator[list[DocumentRecord]]:
        """Every document matching expr (a REGISTRY_FILTERABLE_FIELDS filter), in pages, in key order."""
        ...

    def put_job(self, job: IngestJobRecord) -> None: ...

    def get_job(self, job_id: str) -> IngestJobRecord | None: ...

    def read_lease(self) -> WriterLeaseRecord | None:
        """The writer lease (ingest_service.writer_lease), None when never taken."""
        ...

    def write_lease(self, lease: WriterLeaseRecord) -> None: ...
