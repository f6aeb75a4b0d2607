"""Turns chunk drafts plus their vectors into stored chunk records."""

from __future__ import annotations

import time
import uuid

import numpy as np

from ingest_service.document_facts import DocumentFacts
from ingest_service.requests import IngestItem
from ragrpc.models import ChunkDraft, ChunkKind, ChunkRecord, chunk_id_for


def new_generation() -> str:
    """A fresh, time-ordered generation id for one write of a document's chunks."""
    return f"{time.time_ns():x}-{uuid.uuid4().hex[:8]}"


def build_chunk_records(
    item: IngestItem,
    document_id: str,
    facts: DocumentFacts,
    drafts: list[ChunkDraft],
    vectors: np.ndarray,
    generation: str,
    bm25_terms: list[str] | None = None,
) -> list[ChunkRecord]:
    """The records of `drafts` with their vectors; `bm25_terms`: each draft's analysed BM25 terms joined
    by spaces (ingest_service.preparation), when they were analysed already."""
    now = int(time.time())
    records: list[ChunkRecord] = []
    metadata = {**facts.facts, **item.spec.metadata}
    terms: list[str | None] = list(bm25_terms) if bm25_terms is not None else [None] * len(drafts)
    for draft, vector, analysed in zip(drafts, vectors, terms, strict=True):
        parent_id = ""
        if draft.parent_index >= 0:
            parent_id = chunk_id_for(item.tenant, document_id, generation, draft.parent_index)
        records.append(
            ChunkRecord(
                chunk_id=chunk_id_for(item.tenant, document_id, generation, draft.chunk_index),
                document_id=document_id,
                tenant=item.tenant,
                collection=item.spec.collection or "default",
                generation=generation,
                text=draft.text,
                vector=vector.tolist(),
                chunk_index=draft.chunk_index,
                chunker=draft.chunker,
                source=facts.source,
                title=facts.title,
                media_type=facts.media_type,
                page_start=draft.page_start,
                page_end=draft.page_end,
                section_path=draft.section_path,
                kind=ChunkKind(draft.kind),
                parent_id=parent_id,
                content_hash=facts.content_hash,
                tags=tuple(item.spec.tags),
                doc_date=facts.doc_date,
                created_at=now,
                metadata=dict(metadata),
                bm25_terms=_split_terms(analysed),
            )
        )
    return records


def _split_terms(joined: str | None) -> tuple[str, ...] | None:
    if joined is None:
        return None
    return tuple(joined.split(" ")) if joined else ()


def mean_direction(vectors: list[np.ndarray], dimension: int) -> np.ndarray:
    """The normalised mean of child vectors: the vector of a PARENT chunk (context only, not embedded)."""
    if not vectors:
        unit = np.zeros(dimension, dtype=np.float32)
        unit[0] = 1.0
        return unit
    mean = np.mean(np.stack(vectors), axis=0)
    norm = float(np.linalg.norm(mean))
    return (mean / norm).astype(np.float32) if norm > 0 else mean_direction([], dimension)
