"""The document registry and ingestion jobs, stored in Milvus (not in process memory), so
any replica can answer and a restart loses nothing."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from ragrpc.models import DocumentRecord, DocumentState, IngestJobRecord, document_key
from ragrpc.store import schema as s
from ragrpc.store.collections import CollectionNames
from ragrpc.store.filters import FilterBuilder, FilterExpr
from ragrpc.store.milvus_connection import MilvusConnection, translate_errors

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
_QUERY_LIMIT = 16384

_REGISTRY_FILTER = FilterBuilder(s.REGISTRY_FILTERABLE_FIELDS)


def record_to_row(record: DocumentRecord) -> dict[str, Any]:
    body = dataclasses.asdict(record)
    body["state"] = int(record.state)
    return {
        s.DOC_KEY: record.key,
        s.TENANT: record.tenant,
        s.COLLECTION: record.collection,
        s.DOCUMENT_ID: record.document_id,
        s.CONTENT_HASH: record.content_hash,
        s.SOURCE: record.source[: s.VARCHAR_LIMITS[s.SOURCE]],
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

    def __init__(self, connection: MilvusConnection, names: CollectionNames) -> None:
        self._conn = connection
        self._names = names

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
        key = document_key(tenant, document_id)
        self._conn.write(lambda c: c.delete(self._names.documents, ids=[key]))

    @translate_errors
    def find_by_hash(self, tenant: str, collection: str, content_hash: str) -> list[DocumentRecord]:
        expr = _REGISTRY_FILTER.and_(
            _REGISTRY_FILTER.eq(s.TENANT, tenant),
            _REGISTRY_FILTER.eq(s.COLLECTION, collection),
            _REGISTRY_FILTER.eq(s.CONTENT_HASH, content_hash),
        ).render()
        return self._query(expr)

    @translate_errors
    def list_keys(self, expr: FilterExpr) -> list[str]:
        rows = self._conn.call(
            lambda c: c.query(
                self._names.documents, filter=expr.render(), output_fields=[s.DOC_KEY], limit=_QUERY_LIMIT
            )
        )
        return sorted(row[s.DOC_KEY] for row in rows if row[s.DOC_KEY] != s.MODEL_INFO_KEY)

    @translate_errors
    def in_state(self, state: DocumentState) -> list[DocumentRecord]:
        return self._query(_REGISTRY_FILTER.eq(s.STATE, int(state)).render())

    @translate_errors
    def changed_since(self, updated_after: int) -> list[DocumentRecord]:
        return self._query(_REGISTRY_FILTER.gt(s.UPDATED_AT, int(updated_after)).render())

    def _query(self, expr: str) -> list[DocumentRecord]:
        rows = self._conn.call(
            lambda c: c.query(
                self._names.documents, filter=expr, output_fields=list(_SCALAR_COLUMNS), limit=_QUERY_LIMIT
            )
        )
        return [row_to_record(r) for r in rows if r[s.DOC_KEY] != s.MODEL_INFO_KEY]

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
        rows = self._conn.call(lambda c: c.get(self._names.jobs, ids=[job_id], output_fields=[s.RECORD]))
        if not rows:
            return None
        return IngestJobRecord(**rows[0][s.RECORD])
