"""Document-level facts gathered once per ingestion and applied to its registry record."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from ingest_service.metadata import document_metadata
from ingest_service.requests import IngestItem
from ragrpc.models import DocumentRecord, ExtractedDocument


@dataclass
class DocumentFacts:
    source: str
    title: str
    media_type: str
    content_hash: str
    size_bytes: int
    author: str = ""
    language: str = ""
    page_count: int = 0
    pages_without_text: list[int] = field(default_factory=list)
    doc_date: int = 0
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    chunker: str = ""

    def apply_to(self, record: DocumentRecord) -> None:
        record.source = self.source
        record.title = self.title
        record.media_type = self.media_type
        record.content_hash = self.content_hash
        record.size_bytes = self.size_bytes
        record.author = self.author
        record.language = self.language
        record.page_count = self.page_count
        record.pages_without_text = list(self.pages_without_text)
        record.doc_date = self.doc_date
        record.tags = list(self.tags)
        record.metadata = dict(self.metadata)
        if self.chunker:
            record.chunker = self.chunker


def parse_date(text: str) -> int:
    """Unix seconds of an ISO-8601 date/datetime (UTC when no zone), 0 when unparseable."""
    if not text:
        return 0
    candidate = text.strip().replace("Z", "+00:00")
    try:
        moment = datetime.fromisoformat(candidate)
    except ValueError:
        return 0
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp())


_DERIVED_KEYS = ("size_bytes", "sha256", "file_name", "source")  # already first-class fields


def gather_facts(item: IngestItem, extracted: ExtractedDocument) -> DocumentFacts:
    spec = item.spec
    meta = document_metadata(
        extracted, file_name=spec.file_name, source=spec.source, sha256=item.content_hash, size_bytes=item.size
    )
    extra = {k: v for k, v in meta.extra.items() if k not in _DERIVED_KEYS}
    merged = {**extra, **spec.metadata}
    return DocumentFacts(
        source=spec.source or spec.file_name or "",
        title=spec.title or meta.title or "untitled",
        media_type=extracted.media_type,
        content_hash=item.content_hash,
        size_bytes=item.size,
        author=meta.author,
        language=meta.language,
        page_count=meta.page_count,
        pages_without_text=list(extracted.pages_without_text),
        doc_date=parse_date(meta.modified) or parse_date(meta.created),
        tags=list(spec.tags),
        metadata={str(k): str(v) for k, v in merged.items()},
    )


def no_text_message(extracted: ExtractedDocument) -> str:
    if extracted.pages_without_text:
        pages = ", ".join(map(str, extracted.pages_without_text[:20]))
        return (
            f"the document has no text layer on {len(extracted.pages_without_text)} page(s) ({pages}); "
            "it looks scanned: run OCR on it first (e.g. ocrmypdf) and ingest the result"
        )
    return "the document contains no extractable text"
