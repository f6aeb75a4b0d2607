"""A document's preparation: everything the ingest service does to it before it is embedded.

    bytes -> extract -> clean -> facts (metadata, enrichers, title) -> chunk -> frame (what is embedded)

It is CPU work on the document alone: no store, no model (but for the semantic strategy, below), no
event loop. So it runs where there are cores: in the service's CPU threads, or in the worker processes
of `ingest_service.document_workers`, which build their own `DocumentPreparer` with `build_preparer`
from the same settings and token counter and hand back what it made. Two steps, so that the pipeline
can report and trace them apart: `extract` (with the facts) and `frame` (drafts and embedded texts).

The semantic chunking strategy embeds sentences with the service's model to find topic shifts; the
worker processes do not load the model, so documents that ask for it are prepared in the service
(`needs_model`).
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ingest_service.chunk_planner import ChunkPlannerImpl
from ingest_service.clean import clean_blocks
from ingest_service.document_facts import DocumentFacts, gather_facts, no_text_message
from ingest_service.extract import build_default_registry
from ingest_service.extract.base import ExtractionLimits
from ingest_service.requests import DocumentSpecInput, IngestItem
from ragrpc.analyzer import EnglishAnalyzer
from ragrpc.config import Settings
from ragrpc.context_header import embedded_text
from ragrpc.enrich import Enrichers, build_enrichers
from ragrpc.models import ChunkDraft, ChunkKind, ExtractedDocument
from ragrpc.store.bm25_text import Bm25Text
from ragrpc.store.metadata_fields import MetadataFields
from ragrpc.tokens import KeptShortCounts, TokenCounter

MODEL_STRATEGIES = frozenset({"semantic"})  # chunking strategies that call the embedding model


class DocumentExtractor(Protocol):
    def extract(
        self, data: bytes, *, file_name: str = "", media_type: str = "", password: str = ""
    ) -> ExtractedDocument: ...


class ChunkPlanner(Protocol):
    """Turns an extracted document into chunk drafts for a strategy and sizes."""

    def plan(self, document: ExtractedDocument, strategy: str, size: int, overlap: int) -> list[ChunkDraft]: ...


@dataclass(frozen=True)
class ExtractionStats:
    """What the pipeline reports of an extraction (its trace span's attributes)."""

    media_type: str
    blocks: int
    chars: int

    @classmethod
    def of(cls, extracted: ExtractedDocument) -> ExtractionStats:
        return cls(extracted.media_type, len(extracted.blocks), len(extracted.text))


@dataclass
class FramedDocument:
    """The chunk drafts and, for each retrievable one in order, the text the model embeds; with no
    drafts, why (`no_text`: the message of the NO_TEXT error). `bm25_terms`: when the preparer analyses
    them, each draft's BM25 terms (in draft order, joined by spaces: one string crosses a process
    boundary cheaper than a tuple of words)."""

    drafts: list[ChunkDraft]
    embedded_texts: list[str]
    no_text: str = ""
    bm25_terms: list[str] | None = None


def needs_model(spec: DocumentSpecInput) -> bool:
    """Whether preparing a document with this spec calls the embedding model (its chunking strategy)."""
    return (spec.chunking_strategy or "auto").strip().lower() in MODEL_STRATEGIES


def clean_document(document: ExtractedDocument) -> ExtractedDocument:
    return dataclasses.replace(document, blocks=clean_blocks(document.blocks))


class DocumentPreparer:
    """Extracts, cleans, gathers the facts of, chunks and frames one document at a time (thread-safe:
    every call works on its own document; the counters it shares are safe to share)."""

    def __init__(
        self,
        *,
        extractor: DocumentExtractor,
        planner: ChunkPlanner,
        clean: Callable[[ExtractedDocument], ExtractedDocument],
        enrichers: Enrichers | None,
        context_headers: bool,
        header_counter: Callable[[], TokenCounter],
        window: int,
        bm25: Bm25Text | None = None,
    ) -> None:
        """header_counter: gives the model's token counter, which cuts context headers (asked for once
        headers are framed: a counter copies the model's tokenizer); window: the model's token limit;
        bm25: analyses each draft's BM25 terms (for a store that keeps them); None: the store does."""
        self._bm25 = bm25
        self._extractor = extractor
        self._planner = planner
        self._clean = clean
        self._enrichers = enrichers
        self._context_headers = context_headers
        self._header_counter_factory = header_counter
        self._header_counter: TokenCounter | None = None
        self._window = window

    @property
    def enrichers(self) -> Enrichers | None:
        return self._enrichers

    def extract(
        self, item: IngestItem, metadata_fields: MetadataFields | None, data: bytes | None = None
    ) -> tuple[ExtractedDocument, DocumentFacts]:
        """The cleaned document and its facts; `data`: the item's bytes when read already."""
        try:
            extracted = self._extractor.extract(
                item.read() if data is None else data,
                file_name=item.spec.file_name,
                media_type=item.spec.media_type,
                password=item.spec.password,
            )
        except Exception as exc:
            # The traceback's frames hold the document's bytes (and a parser's state) until the error
            # is collected, which is after the memory budget was given to the next document.
            clear_frames(exc)
            raise
        extracted = self._clean(extracted)
        return extracted, gather_facts(item, extracted, self._enrichers, metadata_fields)

    def frame(self, item: IngestItem, extracted: ExtractedDocument, facts: DocumentFacts) -> FramedDocument:
        """The drafts of the document and what is embedded of each retrievable one (in their order)."""
        spec = item.spec
        drafts = self._planner.plan(
            extracted, spec.chunking_strategy, spec.chunk_size_tokens, spec.chunk_overlap_tokens
        )
        if not drafts:
            return FramedDocument([], [], no_text_message(extracted))
        metadata = {**facts.facts, **spec.metadata}  # the chunks' metadata (ingest_service.chunk_records)
        text = self._embedded_text(facts.title, metadata)
        terms = None
        if self._bm25 is not None:
            analyse = self._bm25.terms
            terms = [" ".join(analyse(facts.title, d.section_path, metadata, d.text)) for d in drafts]
        return FramedDocument(drafts, [text(d) for d in drafts if d.kind == ChunkKind.RETRIEVABLE], bm25_terms=terms)

    def _embedded_text(self, title: str, metadata: dict[str, str]) -> Callable[[ChunkDraft], str]:
        """What is embedded of a draft: its text, after its context header when those are on, the
        header cut to what the draft leaves free of the model's window (`header_budget`)."""
        if not self._context_headers:
            return lambda draft: draft.text
        if self._header_counter is None:
            self._header_counter = self._header_counter_factory()
        # a document's chunks share their header: its count is kept for the next chunk
        counter, window = KeptShortCounts(self._header_counter), self._window

        return lambda draft: embedded_text(
            title, draft.section_path, metadata, draft.text, counter, window, draft.token_bound
        )


def build_preparer(
    settings: Settings,
    counter: TokenCounter,
    window: int,
    *,
    embed: Callable[[list[str]], np.ndarray] | None = None,
    enrichers: Enrichers | None = None,
    bm25_terms: bool = False,
) -> DocumentPreparer:
    """The preparer the settings describe, with the model's token counter and window (the planner
    plans with the whole window: a context header gets what each chunk leaves free). `embed`: the
    model, for the semantic strategy (None in worker processes); `enrichers`: when None, those
    RAGRPC_ENRICHERS names, built here; `bm25_terms`: analyse each draft's BM25 terms, with the analyser
    the store's is built as (ragrpc.store.factory: English, RAGRPC_CONTEXT_HEADERS)."""
    planner = ChunkPlannerImpl(
        counter,
        window,
        default_size=settings.chunk_size_tokens,
        default_overlap=settings.chunk_overlap_tokens,
        max_chunks_per_document=settings.max_chunks_per_document,
        embed=embed,
    )
    return DocumentPreparer(
        extractor=build_default_registry(ExtractionLimits()),
        planner=planner,
        clean=clean_document,
        enrichers=enrichers if enrichers is not None else build_enrichers(settings.enrichers),
        context_headers=settings.context_headers,
        header_counter=lambda: counter,
        window=window,
        bm25=Bm25Text(EnglishAnalyzer(), context_headers=settings.context_headers) if bm25_terms else None,
    )


def clear_frames(exc: BaseException) -> None:
    """Drops the local variables of the frames in `exc`'s traceback and in those of its causes."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if current.__traceback__ is not None:
            traceback.clear_frames(current.__traceback__)
        current = current.__cause__ or current.__context__
