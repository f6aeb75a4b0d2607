"""Filter expressions for the chunk sets the writer deletes (built with the one filter builder)."""

from __future__ import annotations

from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.store.filters import FilterExpr


def chunks_of_generation(tenant: str, document_id: str, generation: str) -> FilterExpr:
    """All chunks one ingestion attempt of a document wrote."""
    return f.and_(f.eq(s.TENANT, tenant), f.eq(s.DOCUMENT_ID, document_id), f.eq(s.GENERATION, generation))


def chunks_of_document(tenant: str, document_id: str) -> FilterExpr:
    """Every chunk of a document, whatever its generation."""
    return f.and_(f.eq(s.TENANT, tenant), f.eq(s.DOCUMENT_ID, document_id))
