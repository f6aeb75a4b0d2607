"""Whether an upload of content already stored needs the document ingested again.

The same bytes uploaded again are not extracted, chunked or embedded again when what the request asks
of them is what the stored document was made with: the chunking (strategy and sizes, recorded at
ingestion as `metadata["chunking_requested"]`), the title it gives, and the metadata it gives. Any of
those changed means other chunks or other embedded headers, so the document is ingested again. Tags
change neither: new tags are applied to the stored document and its chunks without re-embedding.
"""

from __future__ import annotations

from ingest_service.chunking import DEFAULT_STRATEGY
from ingest_service.requests import DocumentSpecInput
from ragrpc.models import DocumentRecord

CHUNKING_KEY = "chunking_requested"


def chunking_request(spec: DocumentSpecInput) -> str:
    """The chunking a request asks for, as recorded: "auto size=default overlap=default"."""
    size = spec.chunk_size_tokens or "default"
    overlap = spec.chunk_overlap_tokens or "default"
    return f"{_strategy(spec)} size={size} overlap={overlap}"


def _strategy(spec: DocumentSpecInput) -> str:
    return (spec.chunking_strategy or DEFAULT_STRATEGY).strip().lower()


def reingest_reason(record: DocumentRecord, spec: DocumentSpecInput) -> str:
    """Why the stored document (same content, ACTIVE, same collection) must be ingested again for
    `spec`, or "" when it need not."""
    recorded = record.metadata.get(CHUNKING_KEY)
    requested = chunking_request(spec)
    if recorded is not None:
        if recorded != requested:
            return f"chunking {requested!r} asked, {recorded!r} stored"
    elif _strategy(spec) != record.chunker or spec.chunk_size_tokens or spec.chunk_overlap_tokens:
        # stored before the chunking request was recorded: only its strategy is known
        return f"chunking {requested!r} asked, {record.chunker or 'unknown'!r} stored"
    title = spec.title.strip()
    if title and title != record.title:
        return "another title"
    changed = sorted(key for key, value in spec.metadata.items() if record.metadata.get(key) != value)
    if changed:
        return f"other metadata ({', '.join(changed[:5])})"
    return ""
