"""Document-level facts gathered once per ingestion and applied to its registry record.

What the extractor found (title, author, language, dates, its other metadata), what the configured
enrichers found (ragrpc.enrich: facts, a title made of them, the header terms of the chunks' context
headers), the title chosen, and what the request gave. The request's metadata wins over every
other value of a key."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import PurePath
from types import MappingProxyType

from ingest_service.metadata import document_metadata
from ingest_service.requests import IngestItem
from ingest_service.reupload import CHUNKING_KEY, chunking_request
from ragrpc.context_header import HEADER_TERMS_KEY
from ragrpc.enrich import ENRICHERS_FAILED_KEY, DocumentSample, Enrichers, TitleSuggestion
from ragrpc.enrich.titles import meaningful_title
from ragrpc.models import BlockKind, DocumentRecord, ExtractedDocument
from ragrpc.store.metadata_fields import MetadataFields


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
    facts: dict[str, str] = field(default_factory=dict)  # what the enrichers found (also in metadata), chunks carry

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


def gather_facts(
    item: IngestItem,
    extracted: ExtractedDocument,
    enrichers: Enrichers | None = None,
    filterable: MetadataFields | None = None,
) -> DocumentFacts:
    """The document's facts. `enrichers`: those the service runs (none when None); `filterable`: the metadata
    keys the collection filters on, whose values must fit their fields (InvalidInputError naming the key)."""
    spec = item.spec
    meta = document_metadata(
        extracted, file_name=spec.file_name, source=spec.source, sha256=item.content_hash, size_bytes=item.size
    )
    extra = {k: v for k, v in meta.extra.items() if k not in _DERIVED_KEYS}
    enrichers = enrichers or Enrichers()
    sample = DocumentSample(
        extracted.text,
        title=meta.title,
        file_name=spec.file_name,
        media_type=extracted.media_type,
        language=meta.language,
        metadata=MappingProxyType(extra),
    )
    enriched = enrichers.enrich(sample)
    title, title_source = choose_title(spec.title, extracted, spec.file_name, enriched.title)
    facts, failed = dict(enriched.facts), enriched.failed
    if HEADER_TERMS_KEY not in spec.metadata:  # the request's own header terms win
        terms, header_failed = enrichers.header_terms({**facts, **spec.metadata}, title)
        facts.update({HEADER_TERMS_KEY: terms} if terms else {})
        failed = tuple(dict.fromkeys((*failed, *header_failed)))
    chunk_facts = {k: v for k, v in facts.items() if k not in spec.metadata}
    if filterable is not None:
        filterable.check_values({**chunk_facts, **spec.metadata})
    merged = {
        **extra,
        **facts,
        "title_source": title_source,
        CHUNKING_KEY: chunking_request(spec),
        **({ENRICHERS_FAILED_KEY: ",".join(failed)} if failed else {}),
        **spec.metadata,
    }
    return DocumentFacts(
        source=spec.source or spec.file_name or "",
        title=title,
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
        facts=chunk_facts,
    )


def choose_title(
    given: str, extracted: ExtractedDocument, file_name: str, suggested: TitleSuggestion | None = None
) -> tuple[str, str]:
    """The document's title and where it came from (recorded as metadata `title_source`): the one
    the caller gave; the file's own title when it is one (not an identifier, a path, a placeholder);
    the document's first heading (when an enricher suggests a title, only a heading it accepts); the
    enricher's suggestion (e.g. a filing's organisation, ticker, document type and period); the first
    short line of text; the file name."""
    if given.strip():
        return given.strip(), "request"
    own = extracted.metadata.title.strip()
    if own and meaningful_title(own, file_name=file_name):
        return own[:300], "file metadata"
    heading = next((b for b in extracted.blocks if b.kind is BlockKind.HEADING and b.text.strip()), None)
    heading_text = " ".join(heading.text.split()) if heading is not None else ""
    accepted = suggested is None or suggested.accepts_heading(heading_text)
    if heading_text and meaningful_title(heading_text) and accepted:
        return heading_text[:300], "first heading"
    if suggested is not None:  # e.g. a filing's first heading that names no company ("FORM 10-K")
        return suggested.text, suggested.source
    for line in extracted.text[:2000].splitlines():
        line = " ".join(line.split())
        if 3 <= len(line) <= 120 and sum(ch.isalpha() for ch in line) >= 3 and meaningful_title(line):
            return line, "first line"
    stem = PurePath(file_name).stem if file_name else ""
    return (stem or "untitled"), ("file name" if stem else "none")


def no_text_message(extracted: ExtractedDocument) -> str:
    if extracted.pages_without_text:
        pages = ", ".join(map(str, extracted.pages_without_text[:20]))
        return (
            f"the document has no text layer on {len(extracted.pages_without_text)} page(s) ({pages}); "
            "it looks scanned: run OCR on it first (e.g. ocrmypdf) and ingest the result"
        )
    return "the document contains no extractable text"
