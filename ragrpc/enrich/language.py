"""The language enricher (`RAGRPC_ENRICHERS=language`): each document's language as chunk metadata.

The ingest service already knows a document's language (the one its file states, e.g. `<html lang>`,
a DOCX's or a Markdown front matter's, else a stop-word guess over its text: en, de, fr, es, nl, it,
pt) and shows it on the document; this enricher puts it into the chunks' metadata as `language`, so
a collection that declares the key (RAGRPC_METADATA_FILTER_KEYS=language) can filter on it
(`--where language=de`). A document whose language is not known gets no fact. It adds no header
terms (a language is not what a passage is about) and analyses no question.
"""

from __future__ import annotations

from collections.abc import Mapping

from ragrpc.enrich.base import DocumentEnrichment, DocumentSample

KEY = "language"


class LanguageEnricher:
    """DocumentEnricher: metadata["language"], an ISO 639-1 code in lower case."""

    name = "language"

    def enrich(self, document: DocumentSample) -> DocumentEnrichment:
        code = document.language.strip().lower().replace("_", "-").split("-")[0]
        if code.isascii() and code.isalpha() and 2 <= len(code) <= 3:
            return DocumentEnrichment({KEY: code})
        return DocumentEnrichment()

    def header_terms(self, metadata: Mapping[str, str], title: str) -> str:
        return ""
