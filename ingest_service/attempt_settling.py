"""Bringing the stored record of a failed or half-finished ingestion attempt to rest, from what is
stored now (the pipeline runs it right after a failure, or later once the store answers again)."""

from __future__ import annotations

from ingest_service.stale_chunks import chunks_of_generation
from ragrpc import errors
from ragrpc.models import DocumentRecord, DocumentState
from ragrpc.store.base import ChunkStore, DocumentRegistry


def settle_attempt(
    registry: DocumentRegistry,
    chunks: ChunkStore,
    attempt: DocumentRecord,
    generation: str,
    error: errors.RagrpcError | None,
) -> None:
    """The attempt's chunks go and its record (with what it learnt, e.g. pages without text) is
    FAILED with `error`, or stays ACTIVE with the previous version; a replaced version's leftover
    chunks go. An attempt that already switched (the store took the write but the reply was lost)
    stays ACTIVE; one that a later attempt superseded is left alone."""
    tenant, document_id = attempt.tenant, attempt.document_id
    stored = registry.get(tenant, document_id)
    if stored is None:
        if generation:
            chunks.delete_chunks(chunks_of_generation(tenant, document_id, generation))
        return
    changed = False
    if generation and stored.pending_generation == generation:
        chunks.delete_chunks(chunks_of_generation(tenant, document_id, generation))
        record = DocumentRecord(**{**attempt.__dict__})
        record.generation, record.stale_generation = stored.generation, stored.stale_generation
        record.pending_generation = ""
        record.state = DocumentState.ACTIVE if stored.state == DocumentState.ACTIVE else DocumentState.FAILED
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
