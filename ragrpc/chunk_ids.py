"""Stored chunk ids: derived from the document, its generation and the chunk's index, so a reader that
knows a generation and how many chunks it wrote (`DocumentRecord.chunk_span`) reads them by primary
key, a key lookup where a filter on the generation scans the collection (milvus-lite at 1M chunks:
about 1.4 ms against 1.2-4 s)."""

from __future__ import annotations

import hashlib


def chunk_id_for(tenant: str, document_id: str, generation: str, index: int) -> str:
    digest = hashlib.sha256(f"{tenant}\x1f{document_id}\x1f{generation}\x1f{index}".encode()).hexdigest()
    return digest[:32]


def chunk_ids_of(tenant: str, document_id: str, generation: str, span: int) -> list[str]:
    """The ids of chunk indexes 0 .. span-1 of one generation."""
    return [chunk_id_for(tenant, document_id, generation, index) for index in range(span)]
