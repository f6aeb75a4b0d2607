"""The document registry and ingestion jobs, stored in Milvus (not in process memory), so
any replica can answer and a restart loses nothing."""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Iterator
from typing import Any

from ragrpc.models import DocumentRecord, DocumentState, IngestJobRecord, WriterLeaseRecord, document_key
from ragrpc.store import schema as s
from ragrpc.store.collections import CollectionNames
from ragrpc.store.filters import FilterBuilder, FilterExpr
from ragrpc.store.milvus_connection import MilvusConnection, translate_errors
from ragrpc.store.paging import DEFAULT_PAGE_SIZE, checked_page_size, scan_rows

_SCALAR_COLUMNS = (
    s.DOC_KEY,
    s.TENANT,
    s.COLLECTION,
    s.DOCUMENT_ID,
    s.CONTENT_HASH,
    s.SOURCE,
    s.GENERATION,
    s.PENDING_GENERATION,
    s.STATE,
    s.UPDATED_AT,
    s.RECORD,
)
_REGISTRY_FILTER = FilterBuilder(s.REGISTRY_FILTERABLE_FIELDS)
_JOBS_FILTER = FilterBuilder(s.JOBS_FILTERABLE_FIELDS)


def _journal_row(prefix: str, journal: str, key: str, at: int) -> dict[str, Any]:
    """A row of a journal kept in the jobs collection: one per document key (its id fits the collection's 64
    characters), tenant field `journal`, the key in RECORD["doc_key"]."""
    return {
        s.JOB_ID: prefix + hashlib.sha256(key.encode()).hexdigest()[:48],
        s.TENANT: journal,
        s.UPDATED_AT: at,
        s.RECORD: {"doc_key": key},
        s.REGISTRY_VECTOR: [1.0, 0.0],
    }


def deletion_row(key: str, deleted_at: int) -> dict[str, Any]:
    """The deletion-journal row of document `key`."""
    return _journal_row("deleted-", s.DELETION_JOURNAL_TENANT, key, deleted_at)


def deletions_expr(after: int) -> FilterExpr:
    return _JOBS_FILTER.and_(
        _JOBS_FILTER.eq(s.TENANT, s.DELETION_JOURNAL_TENANT), _JOBS_FILTER.gt(s.UPDATED_AT, int(after))
    )


def change_row(key: str, changed_at: int) -> dict[str, Any]:
    """The change-journal row of document `key` (one per document: a later change overwrites it)."""
    return _journal_row("changed-", s.CHANGE_JOURNAL_TENANT, key, changed_at)


def record_to_row(record: DocumentRecord) -> dict[str, Any]:
    body = dataclasses.asdict(record)
    body["state"] = int(record.state)
    return {
        s.DOC_KEY: record.key,
        s.TENANT: record.tenant,
        s.COLLECTION: record.collection,
        s.DOCUMENT_ID: record.document_id,
        s.CONTENT_HASH: record.content_hash,
        s.SOURCE: s.clip_utf8(record.source, s.VARCHAR_LIMITS[s.SOURCE]),
        s.GENERATION: record.generation,
        s.PENDING_GENERATION: record.pending_generation,
        s.STATE: int(record.state),
        s.UPDATED_AT: int(record.updated_at),
        s.RECORD: body,
        s.REGISTRY_VECTOR: [1.0, 0.0],
    }


def row_to_record(row: dict[str, Any]) -> DocumentRecord:
    body = dict(row[s.RECORD])
    known = {fld.name for fld in dataclasses.fields(DocumentRecord)}
    body = {k: v for k, v in body.items() if k in known}
    body["state"] = DocumentState(int(row[s.STATE]))
    body["generation"] = row[s.GENERATION]
    body["pending_generation"] = row[s.PENDING_GENERATION]
    return DocumentRecord(**body)


class MilvusDocumentRegistry:
    """DocumentRegistry over the `<prefix>_documents` and `<prefix>_jobs` collections."""

    def __init__(
        self,
        connection: MilvusConnection,
        names: CollectionNames,
        page_size: int = DEFAULT_PAGE_SIZE,
        key_scan_from_rows: int | None = None,
    ) -> None:
        """key_scan_from_rows: scans of a collection of at least this many rows read the matching keys,
        then the rows by key (milvus-lite, see ragrpc.store.paging); None: never."""
        self._conn = connection
        self._names = names
        self.page_size = checked_page_size(page_size)
        self.key_scan_from_rows = key_scan_from_rows

    @property
    def names(self) -> CollectionNames:
        return self._names

    @translate_errors
    def get(self, tenant: str, document_id: str) -> DocumentRecord | None:
        found = self.get_many([document_key(tenant, document_id)])
        return found.get(document_key(tenant, document_id))

    @translate_errors
    def get_many(self, keys: list[str]) -> dict[str, DocumentRecord]:
        if not keys:
            return {}
        rows = self._conn.get_rows(self._names.documents, list(keys), list(_SCALAR_COLUMNS), s.DOC_KEY)
        return {row[s.DOC_KEY]: row_to_record(row) for row in rows if row[s.DOC_KEY] != s.MODEL_INFO_KEY}

    @translate_errors
    def put(self, record: DocumentRecord) -> None:
        record.updated_at = int(time.time())
        row = record_to_row(record)
        self._conn.write_rows("upsert", self._names.documents, [row], s.DOC_KEY)

    @translate_errors
    def delete(self, tenant: str, document_id: str) -> None:
        """Removes the row, journalling the delete first (see deleted_since)."""
        key = document_key(tenant, document_id)
        self._conn.write_rows("upsert", self._names.jobs, [deletion_row(key, int(time.time()))], s.JOB_ID)
        self._conn.write(
            lambda c: c.delete(self._names.documents, ids=[key]), collection=self._names.documents, keys=[key]
        )

    def deleted_since(self, updated_after: int) -> Iterator[list[str]]:
        """Keys of documents deleted after `updated_after` (unix seconds), in pages. A key may have been
        ingested again since: its registry row then exists again."""
        for page in scan_rows(
            self._conn,
            self._names.jobs,
            deletions_expr(updated_after),
            [s.JOB_ID, s.RECORD],
            page_size=self.page_size,
            operation="deletion journal scan",
            by_key=s.JOB_ID if self.key_scan_from_rows is not None else "",
            by_key_from_rows=self.key_scan_from_rows or 0,
        ):
            yield [row[s.RECORD]["doc_key"] for row in page]

    @translate_errors
    def purge_deletions(self, older_than: int) -> None:
        """Drops journal entries written before `older_than` (a reader away longer reloads in full)."""
        expr = _JOBS_FILTER.and_(
            _JOBS_FILTER.eq(s.TENANT, s.DELETION_JOURNAL_TENANT), _JOBS_FILTER.lt(s.UPDATED_AT, int(older_than))
        )
        self._conn.write(lambda c: c.delete(self._names.jobs, filter=expr.render()), collection=self._names.jobs)

    @translate_errors
    def journal_changes(self, keys: list[str]) -> None:
        """Records that these documents' registry rows changed (see changed_since)."""
        if keys:
            now = int(time.time())
            self._conn.write_rows("upsert", self._names.jobs, [change_row(key, now) for key in keys], s.JOB_ID)

    def changed_since(self, updated_after: int) -> Iterator[list[tuple[str, int]]]:
        """(key, when) of the documents journalled as changed after `updated_after` (unix seconds), in
        pages; the registry row says what the change was (the document may be gone again)."""
        expr = _JOBS_FILTER.and_(
            _JOBS_FILTER.eq(s.TENANT, s.CHANGE_JOURNAL_TENANT), _JOBS_FILTER.gt(s.UPDATED_AT, int(updated_after))
        )
        for page in scan_rows(
            self._conn,
            self._names.jobs,
            expr,
            [s.JOB_ID, s.UPDATED_AT, s.RECORD],
            page_size=self.page_size,
            operation="change journal scan",
            by_key=s.JOB_ID if self.key_scan_from_rows is not None else "",
            by_key_from_rows=self.key_scan_from_rows or 0,
        ):
            yield [(row[s.RECORD]["doc_key"], int(row[s.UPDATED_AT])) for row in page]

    @translate_errors
    def purge_changes(self, older_than: int) -> None:
        """Drops change-journal entries written before `older_than`."""
        expr = _JOBS_FILTER.and_(
            _JOBS_FILTER.eq(s.TENANT, s.CHANGE_JOURNAL_TENANT), _JOBS_FILTER.lt(s.UPDATED_AT, int(older_than))
        )
        self._conn.write(lambda c: c.delete(self._names.jobs, filter=expr.render()), collection=self._names.jobs)

    @translate_errors
    def find_by_hash(self, tenant: str, collection: str, content_hash: str) -> list[DocumentRecord]:
        expr = _REGISTRY_FILTER.and_(
            _REGISTRY_FILTER.eq(s.TENANT, tenant),
            _REGISTRY_FILTER.eq(s.COLLECTION, collection),
            _REGISTRY_FILTER.eq(s.CONTENT_HASH, content_hash),
        )
        return [record for page in self.scan(expr) for record in page]

    def list_keys(self, expr: FilterExpr, *, after: str = "", limit: int) -> list[str]:
        """The first `limit` document keys matching expr that sort after `after` (keyset pagination)."""
        if after:
            expr = _REGISTRY_FILTER.and_(expr, _REGISTRY_FILTER.gt(s.DOC_KEY, after))
        keys: list[str] = []
        for page in self._scan_rows(expr, [s.DOC_KEY], page_size=min(self.page_size, limit + 1)):
            keys += [row[s.DOC_KEY] for row in page if row[s.DOC_KEY] != s.MODEL_INFO_KEY]
            if len(keys) >= limit:
                break
        return keys[:limit]

    def scan_keys(self, expr: FilterExpr) -> Iterator[list[str]]:
        """Every document key matching expr, page by page, in key order."""
        for page in self._scan_rows(expr, [s.DOC_KEY]):
            yield [row[s.DOC_KEY] for row in page if row[s.DOC_KEY] != s.MODEL_INFO_KEY]

    def scan(self, expr: FilterExpr) -> Iterator[list[DocumentRecord]]:
        """Every document matching expr, page by page, in key order."""
        for page in self._scan_rows(expr, list(_SCALAR_COLUMNS)):
            yield [row_to_record(r) for r in page if r[s.DOC_KEY] != s.MODEL_INFO_KEY]

    def _scan_rows(
        self, expr: FilterExpr, fields: list[str], page_size: int | None = None
    ) -> Iterator[list[dict[str, Any]]]:
        return scan_rows(
            self._conn,
            self._names.documents,
            expr,
            fields,
            page_size=page_size or self.page_size,
            operation="registry scan",
            by_key=s.DOC_KEY if self.key_scan_from_rows is not None else "",
            by_key_from_rows=self.key_scan_from_rows or 0,
        )

    @translate_errors
    def put_job(self, job: IngestJobRecord) -> None:
        job.updated_at = time.time()
        row = {
            s.JOB_ID: job.job_id,
            s.TENANT: job.tenant,
            s.UPDATED_AT: int(job.updated_at),
            s.RECORD: dataclasses.asdict(job),
            s.REGISTRY_VECTOR: [1.0, 0.0],
        }
        self._conn.write_rows("upsert", self._names.jobs, [row], s.JOB_ID)

    @translate_errors
    def get_job(self, job_id: str) -> IngestJobRecord | None:
        rows = self._conn.call(lambda c: c.get(self._names.jobs, ids=[job_id], output_fields=[s.TENANT, s.RECORD]))
        if not rows or str(rows[0][s.TENANT]).startswith("#"):  # the journals, the writer lease
            return None
        return IngestJobRecord(**rows[0][s.RECORD])

    @translate_errors
    def read_lease(self) -> WriterLeaseRecord | None:
        rows = self._conn.call(  # Strong: another process may have written it
            lambda c: c.get(
                self._names.jobs, ids=[s.WRITER_LEASE_KEY], output_fields=[s.RECORD], consistency_level="Strong"
            )
        )
        return WriterLeaseRecord(**rows[0][s.RECORD]) if rows else None

    @translate_errors
    def write_lease(self, lease: WriterLeaseRecord) -> None:
        row = {
            s.JOB_ID: s.WRITER_LEASE_KEY,
            s.TENANT: s.WRITER_LEASE_KEY,
            s.UPDATED_AT: int(time.time()),
            s.RECORD: dataclasses.asdict(lease),
            s.REGISTRY_VECTOR: [1.0, 0.0],
        }
        self._conn.write_rows("upsert", self._names.jobs, [row], s.JOB_ID)
