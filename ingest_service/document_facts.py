"""Document-level facts gathered once per ingestion and applied to its registry record."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import PurePath

from ingest_service.filing_facts import extract_filing_facts, meaningful_title
from ingest_service.metadata import document_metadata
from ingest_service.requests import IngestItem
from ingest_service.reupload import CHUNKING_KEY, chunking_request
from ragrpc.context_header import FACT_KEYS, facts_phrase
from ragrpc.models import BlockKind, DocumentRecord, ExtractedDocument

_COVER_CHARS = 8000  # what the filing-facts rules read of a document's first pages


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
    facts: dict[str, str] = field(default_factory=dict)  # FACT_KEYS found in the text (also in metadata)

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
    text = extracted.text
    found = extract_filing_facts(text[:_COVER_CHARS], title=meta.title, file_name=spec.file_name, body=text)
    facts = {key: getattr(found, key) for key in FACT_KEYS if getattr(found, key)}
    title, title_source = choose_title(spec.title, extracted, spec.file_name, facts)
    extra = {k: v for k, v in meta.extra.items() if k not in _DERIVED_KEYS}
    merged = {**extra, **facts, "title_source": title_source, CHUNKING_KEY: chunking_request(spec), **spec.metadata}
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
        facts={k: v for k, v in facts.items() if k not in spec.metadata},
    )


def choose_title(given: str, extracted: ExtractedDocument, file_name: str, facts: dict[str, str]) -> tuple[str, str]:
    """The document's title and where it came from (recorded as metadata `title_source`): the one
    the caller gave; the file's own title when it is one (not an identifier, a path, a placeholder);
    the document's first heading (for a filing or report, only one that names its organisation); for
    filings and reports, organisation, ticker, document type and period; the first short line of text;
    the file name."""
    if given.strip():
        return given.strip(), "request"
    own = extracted.metadata.title.strip()
    if own and meaningful_title(own, file_name=file_name):
        return own[:300], "file metadata"
    filing = facts.get("organization") and (facts.get("document_type") or facts.get("fiscal_period"))
    heading = next((b for b in extracted.blocks if b.kind is BlockKind.HEADING and b.text.strip()), None)
    heading_text = " ".join(heading.text.split()) if heading is not None else ""
    if heading_text and meaningful_title(heading_text) and (not filing or names_organization(heading_text, facts)):
        return heading_text[:300], "first heading"
    if filing:  # a filing's first heading that names no company ("SECURITIES AND EXCHANGE COMMISSION", "FORM 10-K")
        return facts_phrase(facts), "filing facts"
    for line in extracted.text[:2000].splitlines():
        line = " ".join(line.split())
        if 3 <= len(line) <= 120 and sum(ch.isalpha() for ch in line) >= 3 and meaningful_title(line):
            return line, "first line"
    stem = PurePath(file_name).stem if file_name else ""
    return (stem or "untitled"), ("file name" if stem else "none")


_NOT_NAME_WORDS = frozenset(
    "the and of inc incorporated corp corporation co company companies ltd limited plc llc lp group holdings"
    " international".split()
)


def names_organization(text: str, facts: dict[str, str]) -> bool:
    """Whether `text` names the organisation of `facts`: its ticker, or one of the first two words of its name
    that are not legal or common words ("Amazon.com, Inc." -> amazon, com; "The Coca-Cola Company" -> coca, cola)."""
    words = set(re.findall(r"[^\W_]+", text.casefold()))
    name = [w for w in re.findall(r"[^\W_]+", facts.get("organization", "").casefold()) if w not in _NOT_NAME_WORDS]
    return bool(words & set(name[:2])) or facts.get("ticker", "").casefold() in words - {""}


def no_text_message(extracted: ExtractedDocument) -> str:
    if extracted.pages_without_text:
        pages = ", ".join(map(str, extracted.pages_without_text[:20]))
        return (
            f"the document has no text layer on {len(extracted.pages_without_text)} page(s) ({pages}); "
            "it looks scanned: run OCR on it first (e.g. ocrmypdf) and ingest the result"
        )
    return "the document contains no extractable text"
