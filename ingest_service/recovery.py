"""Putting right what an interrupted or failed ingestion attempt left in the store: the store-only
half of the document lifecycle (ingest_service.lifecycle owns the locks and calls these under them,
or at start before it serves).

- `settle_failed_attempt`: the failed attempt's chunks go and its record is FAILED, or stays ACTIVE
  with the previous version; also run later, in the background, when the store refused it at first.
- `recover_documents`: at start, every document page by page: deletes finished, chunks of
  interrupted attempts and of replaced versions removed, documents left PROCESSING settled.
"""

from __future__ import annotations

import logging
import time

from ragrpc import errors
from ragrpc.models import DocumentRecord, DocumentState
from ragrpc.store import schema as s
from ragrpc.store.base import ChunkStore, DocumentRegistry
from ragrpc.store.filters import FilterBuilder, chunks_of_document, chunks_of_generation

logger = logging.getLogger(__name__)

_REGISTRY_FILTER = FilterBuilder(s.REGISTRY_FILTERABLE_FIELDS)


def settle_failed_attempt(
    registry: DocumentRegistry,
    chunks: ChunkStore,
    attempt: DocumentRecord,
    generation: str,
    error: errors.RagrpcError | None,
) -> None:
    """The attempt's chunks go and the record no longer names it. A first ingestion's record is
    FAILED with `error` (and what the attempt learnt, e.g. pages without text); a replacement's
    stays the stored, visible version - its content hash, title, facts and chunk count, not the
    attempt's, so that the same content uploaded again is ingested, not found unchanged - with
    `error` noted. A replaced version's leftover chunks go. An attempt that already switched (the
    store took the write but the reply was lost) stays ACTIVE; one that a later attempt
    superseded is left alone. A record marked for deletion is never written back (its delete
    finishes it; a Milvus 2.3 Session read may still show a row already deleted)."""
    tenant, document_id = attempt.tenant, attempt.document_id
    stored = registry.get(tenant, document_id)
    if stored is None or stored.deleting:  # gone, or its delete (which removes every chunk) owns it now
        if generation:
            chunks.delete_chunks(chunks_of_generation(tenant, document_id, generation))
        return
    changed = False
    if generation and stored.pending_generation == generation:
        chunks.delete_chunks(chunks_of_generation(tenant, document_id, generation))
        if stored.state == DocumentState.ACTIVE:
            record = DocumentRecord(**{**stored.__dict__})
        else:
            record = DocumentRecord(**{**attempt.__dict__})
            record.generation, record.stale_generation = stored.generation, stored.stale_generation
            record.state = DocumentState.FAILED
        record.pending_generation = ""
        if error is not None:
            record.error = error.message
            record.error_code = errors.status_name(error)
        stored, changed = record, True
    if stored.stale_generation and stored.stale_generation != stored.generation:
        chunks.delete_chunks(chunks_of_generation(tenant, document_id, stored.stale_generation))
        stored.stale_generation = ""
        changed = True
    if changed:
        registry.put(stored)


def recover_documents(registry: DocumentRegistry, chunks: ChunkStore) -> dict[str, int]:
    """Run by the writer at start, before it serves: finishes deletes, removes chunks of
    interrupted attempts and of replaced versions, and fails documents left PROCESSING."""
    counts = {"deletes_finished": 0, "attempts_rolled_back": 0, "stale_versions_removed": 0}
    scanned = 0
    # Every document, page by page (the markers of an interrupted attempt live in each row's record).
    for page in registry.scan(_REGISTRY_FILTER.gte(s.STATE, 0)):
        for record in page:
            _recover(registry, chunks, record, counts)
        scanned += len(page)
    logger.info("recovery checked %d documents", scanned)
    # Readers follow deletes through the journal while they run; one that was away this long loads in full.
    registry.purge_deletions(int(time.time()) - s.DELETION_JOURNAL_KEEP_S)
    if any(counts.values()):
        logger.warning("recovery after an interrupted run: %s", counts)
    return counts


def _recover(registry: DocumentRegistry, chunks: ChunkStore, record: DocumentRecord, counts: dict[str, int]) -> None:
    if record.deleting:
        chunks.delete_chunks(chunks_of_document(record.tenant, record.document_id))
        registry.delete(record.tenant, record.document_id)
        counts["deletes_finished"] += 1
        return
    changed = False
    if record.pending_generation:
        chunks.delete_chunks(chunks_of_generation(record.tenant, record.document_id, record.pending_generation))
        record.pending_generation = ""
        counts["attempts_rolled_back"] += 1
        changed = True
    if record.stale_generation:
        chunks.delete_chunks(chunks_of_generation(record.tenant, record.document_id, record.stale_generation))
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
        registry.put(record)
