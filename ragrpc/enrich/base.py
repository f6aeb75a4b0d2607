"""The two enricher protocols: knowledge of one kind of document, plugged into the domain-neutral core.

A `DocumentEnricher` runs in the ingest service, once per document, on what was extracted:

    enrich(DocumentSample) -> DocumentEnrichment    facts for the document's metadata (and its chunks'),
                                                     and optionally a title made of them
    header_terms(metadata, title) -> str             the words every chunk's context header names after
                                                     the title (ragrpc.context_header), given the
                                                     document's final metadata and title

A `QueryAnalyser` runs in the query service, once per question:

    analyse(question) -> QueryAnalysis               extra terms for the BM25 query, and optionally the
                                                     metadata filters the question implies

One object may be both (`ragrpc.enrich.filings.FilingsEnricher` is). Enrichers are pure with respect to
the services: they get text and give values, never touch a store, and are built once at start
(`ragrpc.enrich.registry`); the ones configured run in order, and what one of them raises costs only
its own contribution (see `ragrpc.enrich.registry.Enrichers`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, runtime_checkable

FIRST_PAGES_CHARS = 8_000  # what `DocumentSample.first_pages` holds of a document: covers, front matter, abstracts
_WORDS = re.compile(r"[^\W_]+")
_EMPTY: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class DocumentSample:
    """What an enricher reads of a document being ingested."""

    text: str  # the whole extracted, cleaned text
    title: str = ""  # the title the file states, else its first heading, else its file name's stem
    file_name: str = ""
    media_type: str = ""
    language: str = ""  # ISO 639-1 code the file states or the text's stop words give; "" when unsure
    metadata: Mapping[str, str] = field(default_factory=lambda: _EMPTY)  # what the extractor found besides

    @property
    def first_pages(self) -> str:
        """The document's first `FIRST_PAGES_CHARS` characters."""
        return self.text[:FIRST_PAGES_CHARS]


@dataclass(frozen=True)
class TitleSuggestion:
    """A title an enricher makes of its facts, for a document whose file states none worth keeping.

    The ingest service takes it after the file's own title and before the first line of text; a first
    heading wins over it only when it holds one of `heading_words` (casefolded words, e.g. the company's
    name: "SECURITIES AND EXCHANGE COMMISSION" gives way to "Amazon.com, Inc. 10-K FY2017", "AMD Reports
    Fourth Quarter Results" does not)."""

    text: str
    source: str  # recorded as metadata["title_source"]
    heading_words: frozenset[str] = frozenset()

    def accepts_heading(self, heading: str) -> bool:
        return bool(set(_WORDS.findall(heading.casefold())) & self.heading_words)


@dataclass(frozen=True)
class DocumentEnrichment:
    """What an enricher found in a document: metadata facts (key -> value, stored in the document's and
    its chunks' metadata, where a filter can select them when the collection declares the key), and a
    title suggestion. Nothing found: the empty enrichment."""

    facts: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    title: TitleSuggestion | None = None


@dataclass(frozen=True)
class QueryAnalysis:
    """What an analyser reads in a question: `sparse_terms` are added to the BM25 query after the question
    (the dense query stays the question as asked); `filters` (metadata key -> accepted values) narrow the
    search where the request itself does not filter that key and the collection declares it."""

    sparse_terms: tuple[str, ...] = ()
    filters: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))


@runtime_checkable
class DocumentEnricher(Protocol):
    """Document-level knowledge for the ingest service (see the module docstring)."""

    name: str

    def enrich(self, document: DocumentSample) -> DocumentEnrichment: ...

    def header_terms(self, metadata: Mapping[str, str], title: str) -> str:
        """The words chunks' context headers carry after `title` ("" for none): `metadata` is the document's
        final chunk metadata (this enricher's facts, overridden by what the request gave)."""
        ...


@runtime_checkable
class QueryAnalyser(Protocol):
    """Question-level knowledge for the query service (see the module docstring)."""

    name: str

    def analyse(self, question: str) -> QueryAnalysis: ...
