"""Enrichers: optional knowledge of one kind of document, behind two small protocols.

`base` defines them (DocumentEnricher at ingestion, QueryAnalyser at query time), `registry` holds
the built-in ones and builds the set RAGRPC_ENRICHERS names, `filings` and `language` are the built-in
enrichers, `titles` what the ingest service and enrichers share to judge a title. The pipelines call
the protocols and know no domain.
"""

from ragrpc.enrich.base import (
    FIRST_PAGES_CHARS,
    DocumentEnricher,
    DocumentEnrichment,
    DocumentSample,
    QueryAnalyser,
    QueryAnalysis,
    TitleSuggestion,
)
from ragrpc.enrich.registry import ENRICHERS_FAILED_KEY, EnrichedDocument, Enrichers, build_enrichers

__all__ = [
    "ENRICHERS_FAILED_KEY",
    "FIRST_PAGES_CHARS",
    "DocumentEnricher",
    "DocumentEnrichment",
    "DocumentSample",
    "EnrichedDocument",
    "Enrichers",
    "QueryAnalyser",
    "QueryAnalysis",
    "TitleSuggestion",
    "build_enrichers",
]
