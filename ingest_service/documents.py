"""Documents as resources: get, list (paged), update metadata, delete; and recovery of
whatever an interrupted writer left behind."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import logging
import time
from dataclasses import dataclass

from ingest_service.chunk_records import copied_chunk_id, new_generation
from ingest_service.requests import DOCUMENT_ID_PATTERN, DocumentSpecInput, validate_spec
from ingest_service.stale_chunks import chunks_of_document, chunks_of_generation
from ragrpc import errors
from ragrpc.models import ChunkRecord, DocumentRecord, DocumentState
from ragrpc.store import schema as s
from ragrpc.store.base import ChunkStore, DocumentRegistry
from ragrpc.store.filters import FilterBuilder

logger = logging.getLogger(__name__)

DELETION_JOURNAL_KEEP_S = 7 * 24 * 3600
MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 50
UPDATABLE_FIELDS = ("title", "tags", "metadata")

_REGISTRY_FILTER = FilterBuilder(s.REGISTRY_FILTERABLE_FIELDS)


@dataclass
class DocumentPage:
    documents: list[DocumentRecord]
    next_page_token: str


def _check_id(document_id: str) -> None:
    if not document_id:
        raise errors.InvalidInputError("document_id is required", field="document_id")
    if not DOCUMENT_ID_PATTERN.match(document_id):
        raise errors.InvalidInputError(f"document_id {document_id[:140]!r} is invalid", field="document_id")


def _encode_token(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode()).decode()


def _decode_token(token: str) -> str:
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise errors.InvalidInputError("page_token is not a token this service issued", field="page_token") from None


class DocumentService:
    """Synchronous document operations (callers run them off the event loop)."""

    def __init__(self, registry: DocumentRegistry, chunks: ChunkStore) -> None:
        self._registry = registry
        self._chunks = chunks

    def get(self, tenant: str, document_id: str) -> DocumentRecord:
        _check_id(document_id)
        record = self._registry.get(tenant, document_id)
        if record is None or record.deleting:
            raise errors.NotFoundError(
                f"document {document_id!r} does not exist", metadata={"document_id": document_id}
            )
        return record

    def list_page(
        self,
        tenant: str,
        *,
        page_size: int = 0,
        page_token: str = "",
        state: DocumentState | None = None,
        source: str = "",
        collection: str = "",
    ) -> DocumentPage:
        if page_size < 0 or page_size > MAX_PAGE_SIZE:
            raise errors.InvalidInputError(f"page_size must be between 0 and {MAX_PAGE_SIZE}", field="page_size")
        size = page_size or DEFAULT_PAGE_SIZE
        conditions = [_REGISTRY_FILTER.eq(s.TENANT, tenant)]
        if state is not None:
            conditions.append(_REGISTRY_FILTER.eq(s.STATE, int(state)))
        if source:
            conditions.append(_REGISTRY_FILTER.eq(s.SOURCE, source))
        if collection:
            conditions.append(_REGISTRY_FILTER.eq(s.COLLECTION, collection))
        after = _decode_token(page_token) if page_token else ""
        expr = _REGISTRY_FILTER.and_(*conditions)
        # One more key than the page tells whether another page follows; documents being deleted are
        # skipped, so a page may hold fewer than `size` documents and still have a next page.
        keys = self._registry.list_keys(expr, after=after, limit=size + 1)
        page_keys = keys[:size]
        found = self._registry.get_many(page_keys)
        documents = [found[k] for k in page_keys if k in found and not found[k].deleting]
        next_token = _encode_token(page_keys[-1]) if len(keys) > size else ""
        return DocumentPage(documents, next_token)

    def update(
        self,
        tenant: str,
        document_id: str,
        *,
        fields: list[str],
        title: str = "",
        tags: list[str] | None = None,
        metadata: dict[str, str] | None = None,
    ) -> DocumentRecord:
        """Changes title/tags/metadata in the registry and on the stored chunks (their vectors are
        kept), so filters see the new values. No re-extraction, no re-embedding."""
        unknown = [name for name in fields if name not in UPDATABLE_FIELDS]
        if not fields or unknown:
            raise errors.InvalidInputError(
                f"update_mask must name some of {', '.join(UPDATABLE_FIELDS)}; got {', '.join(fields) or 'nothing'}",
                field="update_mask",
            )
        validate_spec(DocumentSpecInput(tags=list(tags or []), metadata=dict(metadata or {})), field_prefix="document")
        record = self.get(tenant, document_id)
        if record.state != DocumentState.ACTIVE or record.pending_generation:
            raise errors.PreconditionError(f"document {document_id!r} is not ACTIVE (it is being ingested or failed)")
        if "title" in fields:
            record.title = title
        if "tags" in fields:
            record.tags = list(tags or [])
        if "metadata" in fields:
            record.metadata = dict(metadata or {})
        self._rewrite_chunk_fields(record)
        self._registry.put(record)
        return record

    def _rewrite_chunk_fields(self, record: DocumentRecord) -> None:
        expr = chunks_of_generation(record.tenant, record.document_id, record.generation)
        chunks = [chunk for page in self._chunks.scan_chunks(expr, with_vectors=True) for chunk in page]
        for chunk in chunks:
            chunk.title = record.title
            chunk.tags = tuple(record.tags)
            chunk.metadata = dict(record.metadata)
        if not chunks:
            return
        if self._chunks.upsert_keeps_partitions:
            self._chunks.upsert_chunks(chunks)
        else:
            self._rewrite_as_new_generation(record, chunks)

    def _rewrite_as_new_generation(self, record: DocumentRecord, chunks: list[ChunkRecord]) -> None:
        """For servers whose upsert breaks partition-key routing: the same crash-safe steps as a
        replacement (new rows under a fresh generation, registry switch, old rows dropped; recovery
        finishes any of them), with the stored vectors, so nothing is embedded again. Chunk ids change."""
        generation = new_generation()
        new_ids = {c.chunk_id: copied_chunk_id(c.chunk_id, generation) for c in chunks}
        copies = [
            dataclasses.replace(
                c, chunk_id=new_ids[c.chunk_id], generation=generation, parent_id=new_ids.get(c.parent_id, c.parent_id)
            )
            for c in chunks
        ]
        record.pending_generation = generation
        self._registry.put(record)
        self._chunks.insert_chunks(copies)
        old_generation = record.generation
        record.generation, record.pending_generation, record.stale_generation = generation, "", old_generation
        self._registry.put(record)
        self._chunks.delete_chunks(chunks_of_generation(record.tenant, record.document_id, old_generation))
        record.stale_generation = ""

    def delete(self, tenant: str, document_id: str) -> int:
        """Deletes the chunks, then the registry row; a crash in between is finished by recovery."""
        record = self.get(tenant, document_id)
        record.deleting = True
        self._registry.put(record)
        deleted = self._chunks.delete_chunks(chunks_of_document(tenant, document_id))
        self._registry.delete(tenant, document_id)
        return deleted or record.chunk_count


class DocumentRecovery:
    """Run by the (single) writer at start: finishes deletes, removes chunks of interrupted
    attempts and of replaced versions, and fails documents left PROCESSING."""

    def __init__(self, registry: DocumentRegistry, chunks: ChunkStore) -> None:
        self._registry = registry
        self._chunks = chunks

    def run(self) -> dict[str, int]:
        counts = {"deletes_finished": 0, "attempts_rolled_back": 0, "stale_versions_removed": 0}
        scanned = 0
        # Every document, page by page (the markers of an interrupted attempt live in each row's record).
        for page in self._registry.scan(_REGISTRY_FILTER.gte(s.STATE, 0)):
            for record in page:
                self._recover(record, counts)
            scanned += len(page)
        logger.info("recovery checked %d documents", scanned)
        # Readers follow deletes through the journal while they run; one that was away this long loads in full.
        self._registry.purge_deletions(int(time.time()) - DELETION_JOURNAL_KEEP_S)
        if any(counts.values()):
            logger.warning("recovery after an interrupted run: %s", counts)
        return counts

    def _recover(self, record: DocumentRecord, counts: dict[str, int]) -> None:
        if record.deleting:
            self._chunks.delete_chunks(chunks_of_document(record.tenant, record.document_id))
            self._registry.delete(record.tenant, record.document_id)
            counts["deletes_finished"] += 1
            return
        changed = False
        if record.pending_generation:
            self._chunks.delete_chunks(
                chunks_of_generation(record.tenant, record.document_id, record.pending_generation)
            )
            record.pending_generation = ""
            counts["attempts_rolled_back"] += 1
            changed = True
        if record.stale_generation:
            self._chunks.delete_chunks(chunks_of_generation(record.tenant, record.document_id, record.stale_generation))
            record.stale_generation = ""
            counts["stale_versions_removed"] += 1
            changed = True
        if record.state in (DocumentState.PENDING, DocumentState.PROCESSING):
            record.state = DocumentState.ACTIVE if record.generation else DocumentState.FAILED
            if record.state == DocumentState.FAILED:
                record.error = "ingestion was interrupted by a restart of the ingest service; ingest it again"
                record.error_code = "ABORTED"
            changed = True
        if changed:
            self._registry.put(record)
