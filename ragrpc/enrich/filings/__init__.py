"""The filings enricher (`RAGRPC_ENRICHERS=filings`): SEC filings and financial reports.

At ingestion (`enrich`), the facts of a filing or report read from its first pages
(`ragrpc.enrich.filings.facts`): metadata `organization`, `ticker`, `document_type` and `fiscal_period`;
a title made of them for a filing whose file states none (a first heading that names no company, such
as "SECURITIES AND EXCHANGE COMMISSION", gives way to it); and the header terms every chunk's context
header carries (`facts_phrase`: "Advanced Micro Devices, Inc. (AMD) 10-K FY2022"), so that a passage
of one company's filing can be told from the like passage of another's, or of another year's.

At query time (`analyse`), the fiscal periods a question names in the form those headers carry them
("fiscal 2017" -> "FY2017", "Q2 of FY23" -> "2023-Q2"; `ragrpc.enrich.filings.questions`), added to the
BM25 query. It implies no filter.

To filter on the facts, declare them on the collection when it is created:
RAGRPC_METADATA_FILTER_KEYS=organization,ticker,document_type,fiscal_period.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ragrpc.enrich.base import DocumentEnrichment, DocumentSample, QueryAnalysis, TitleSuggestion
from ragrpc.enrich.filings.facts import extract_filing_facts
from ragrpc.enrich.filings.questions import period_terms

# The metadata keys of the facts, in the order the header names them.
FACT_KEYS = ("organization", "ticker", "document_type", "fiscal_period")
TITLE_SOURCE = "filing facts"  # metadata["title_source"] of a title made of the facts
_WORDS = re.compile(r"[^\W_]+")
_NOT_NAME_WORDS = frozenset(
    "the and of inc incorporated corp corporation co company companies ltd limited plc llc lp group holdings"
    " international".split()
)


class FilingsEnricher:
    """DocumentEnricher and QueryAnalyser for filings and financial reports (see the module docstring)."""

    name = "filings"

    def enrich(self, document: DocumentSample) -> DocumentEnrichment:
        found = extract_filing_facts(
            document.first_pages, title=document.title, file_name=document.file_name, body=document.text
        )
        facts = {key: getattr(found, key) for key in FACT_KEYS if getattr(found, key)}
        filing = facts.get("organization") and (facts.get("document_type") or facts.get("fiscal_period"))
        title = TitleSuggestion(facts_phrase(facts), TITLE_SOURCE, heading_words(facts)) if filing else None
        return DocumentEnrichment(facts, title)

    def header_terms(self, metadata: Mapping[str, str], title: str) -> str:
        return facts_phrase(metadata, said=" ".join(title.split()) if title else "")

    def analyse(self, question: str) -> QueryAnalysis:
        return QueryAnalysis(sparse_terms=tuple(period_terms(question)))


def facts_phrase(metadata: Mapping[str, str] | None, said: str = "") -> str:
    """The facts of `FACT_KEYS` in `metadata` that `said` (the title) does not already say, in one
    phrase: "Advanced Micro Devices, Inc. (AMD) 10-K FY2022". A ticker is in parentheses, and left
    out when `said` or the organisation already has it as a word."""
    said_text = said.casefold()
    parts: list[str] = []
    for key in FACT_KEYS:
        value = " ".join(str((metadata or {}).get(key) or "").split())
        if not value:
            continue
        if key == "ticker":
            if value.casefold() in _WORDS.findall(f"{said_text} {' '.join(parts).casefold()}"):
                continue
            value = f"({value})"
        elif value.casefold() in said_text:
            continue
        parts.append(value)
    return " ".join(parts)


def heading_words(facts: Mapping[str, str]) -> frozenset[str]:
    """The words of which a heading that names the filing's organisation holds one: its ticker, or one of the first
    two words of its name that are not legal or common words ("Amazon.com, Inc." -> amazon, com; "The Coca-Cola
    Company" -> coca, cola)."""
    name = [w for w in _WORDS.findall(facts.get("organization", "").casefold()) if w not in _NOT_NAME_WORDS]
    ticker = facts.get("ticker", "").casefold()
    return frozenset(name[:2]) | (frozenset({ticker}) if ticker else frozenset())
