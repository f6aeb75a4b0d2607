"""The one place enrichers are registered, and the set a service runs (`RAGRPC_ENRICHERS`).

    RAGRPC_ENRICHERS=""                      none (the default): no domain rules at ingestion or query time
    RAGRPC_ENRICHERS=filings                 SEC filings and financial reports (ragrpc.enrich.filings)
    RAGRPC_ENRICHERS=filings,language        several, run in this order
    RAGRPC_ENRICHERS=mypackage.legal:CaseLawEnricher
                                             your own: "module:attribute", a class or function called with
                                             no arguments that returns a DocumentEnricher, a QueryAnalyser
                                             or both (ragrpc.enrich.base)

Both services read the same setting: the ingest service runs each enricher's document side, the query
service its query side (an enricher without one is skipped there).

What an enricher raises, or gives that is not text, costs only its own contribution: its facts, title
suggestion, header terms or query terms are left out, the failure is logged with the enricher's name and
counted (`Enrichers.failures`), and a document it failed on says so in its metadata
(`ENRICHERS_FAILED_KEY`); the document is ingested and the question answered as without it.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType
from typing import TypeVar

from ragrpc import errors
from ragrpc.enrich.base import (
    DocumentEnricher,
    DocumentEnrichment,
    DocumentSample,
    QueryAnalyser,
    QueryAnalysis,
    TitleSuggestion,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")

SETTING = "RAGRPC_ENRICHERS"
ENRICHERS_FAILED_KEY = "enrichers_failed"  # document metadata: the enrichers that failed on it, comma-separated
MAX_FACT_CHARS = 4096  # the longest metadata value (as a request's metadata)


# name -> "module:attribute" of its class (imported when named): a new built-in enricher is its module and a line here
BUILT_IN: Mapping[str, str] = MappingProxyType(
    {"filings": "ragrpc.enrich.filings:FilingsEnricher", "language": "ragrpc.enrich.language:LanguageEnricher"}
)


@dataclass(frozen=True)
class EnrichedDocument:
    """The enrichers' findings on one document, merged: facts (the first enricher to give a key wins), the
    first title suggestion, and the names of the enrichers that failed on it."""

    facts: Mapping[str, str]
    title: TitleSuggestion | None
    failed: tuple[str, ...] = ()


class Enrichers:
    """The enrichers a service runs, in order, each failure isolated (see the module docstring). Both a
    document enricher and a query analyser, whatever its members are (an empty set adds nothing)."""

    name = "enrichers"

    def __init__(self, plugins: Iterable[object] = (), *, on_failure: Callable[[str], None] | None = None) -> None:
        self._on_failure = on_failure  # e.g. the ragrpc_enricher_failures_total{enricher} counter
        self._plugins = tuple(plugins)
        for plugin in self._plugins:
            if not isinstance(plugin, DocumentEnricher | QueryAnalyser):
                raise errors.PreconditionError(
                    f"{SETTING}: {_name(plugin)} is neither a DocumentEnricher (name, enrich, header_terms) nor a "
                    "QueryAnalyser (name, analyse); see ragrpc.enrich.base",
                )
        self._documents = tuple(p for p in self._plugins if isinstance(p, DocumentEnricher))
        self._queries = tuple(p for p in self._plugins if isinstance(p, QueryAnalyser))
        self._lock = threading.Lock()
        self.failures: Counter[str] = Counter()  # enricher name -> calls that failed, since start

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(_name(p) for p in self._plugins)

    def enrich(self, document: DocumentSample) -> EnrichedDocument:
        facts: dict[str, str] = {}
        title: TitleSuggestion | None = None
        failed: list[str] = []
        for enricher in self._documents:
            found = self._guarded(enricher, "enrich", partial(_enrichment, enricher, document))
            if found is None:
                failed.append(_name(enricher))
                continue
            for key, value in found.facts.items():
                facts.setdefault(key, value)
            title = title or found.title
        return EnrichedDocument(MappingProxyType(facts), title, tuple(failed))

    def header_terms(self, metadata: Mapping[str, str], title: str) -> tuple[str, tuple[str, ...]]:
        """The enrichers' header terms, in order, joined by spaces; and the names of those that failed."""
        terms: list[str] = []
        failed: list[str] = []
        for enricher in self._documents:
            found = self._guarded(enricher, "header_terms", partial(_header_terms, enricher, metadata, title))
            if found is None:
                failed.append(_name(enricher))
            elif found:
                terms.append(found)
        return " ".join(terms), tuple(failed)

    def analyse(self, question: str) -> QueryAnalysis:
        """The analysers' findings, merged: terms in order (each once), filters of the first to name a key."""
        terms: list[str] = []
        filters: dict[str, tuple[str, ...]] = {}
        for analyser in self._queries:
            found = self._guarded(analyser, "analyse", partial(_analysis, analyser, question))
            if found is None:
                continue
            terms.extend(term for term in found.sparse_terms if term not in terms)
            for key, values in found.filters.items():
                filters.setdefault(key, tuple(values))
        return QueryAnalysis(tuple(terms), MappingProxyType(filters))

    def count_failure(self, name: str) -> None:
        """Counts a failed call of enricher `name` (also one that ran in another process, such as the
        ingest service's document workers, which build their own enrichers from the same setting)."""
        with self._lock:
            self.failures[name] += 1
        if self._on_failure is not None:
            self._on_failure(name)

    def _guarded(self, plugin: object, call: str, run: Callable[[], T]) -> T | None:
        try:
            return run()
        except Exception as exc:  # noqa: BLE001 - a plug-in's failure costs only its own contribution
            name = _name(plugin)
            self.count_failure(name)
            logger.warning(
                "enricher %s failed in %s (%s: %s); its contribution is left out",
                name,
                call,
                type(exc).__name__,
                exc,
                exc_info=logger.isEnabledFor(logging.DEBUG),
            )
            return None


def _name(plugin: object) -> str:
    return str(getattr(plugin, "name", "") or type(plugin).__name__)


def _enrichment(enricher: DocumentEnricher, document: DocumentSample) -> DocumentEnrichment:
    found: object = enricher.enrich(document)
    if not isinstance(found, DocumentEnrichment):
        raise TypeError(f"enrich gave {type(found).__name__}, not a DocumentEnrichment")
    for key, value in found.facts.items():
        if not isinstance(key, str) or not key or not isinstance(value, str):
            raise TypeError(f"fact {key!r}: keys and values must be text, keys not empty")
        if len(value) > MAX_FACT_CHARS:
            raise ValueError(f"fact {key!r} is {len(value)} characters; at most {MAX_FACT_CHARS}")
    if found.title is not None and not (isinstance(found.title, TitleSuggestion) and found.title.text.strip()):
        raise TypeError("a title suggestion must be a TitleSuggestion with text")
    return found


def _header_terms(enricher: DocumentEnricher, metadata: Mapping[str, str], title: str) -> str:
    terms: object = enricher.header_terms(metadata, title)
    if not isinstance(terms, str):
        raise TypeError(f"header_terms gave {type(terms).__name__}, not text")
    return terms


def _analysis(analyser: QueryAnalyser, question: str) -> QueryAnalysis:
    found: object = analyser.analyse(question)
    if not isinstance(found, QueryAnalysis):
        raise TypeError(f"analyse gave {type(found).__name__}, not a QueryAnalysis")
    if not all(isinstance(term, str) for term in found.sparse_terms):
        raise TypeError("sparse terms must be text")
    for key, values in found.filters.items():
        if not isinstance(key, str) or isinstance(values, str) or not all(isinstance(v, str) for v in values):
            raise TypeError(f"filter {key!r}: a key and a sequence of text values")
    return found


def parse_enrichers(setting: str) -> tuple[str, ...]:
    """The entries of RAGRPC_ENRICHERS, in order, each once ("" and "none": no enricher)."""
    entries = [entry.strip() for entry in setting.split(",")]
    named = [entry for entry in entries if entry]
    if named in (["none"], ["None"]):
        return ()
    return tuple(dict.fromkeys(named))


def build_enrichers(setting: str, on_failure: Callable[[str], None] | None = None) -> Enrichers:
    """The enrichers RAGRPC_ENRICHERS names (see the module docstring); PreconditionError naming the setting for
    an unknown name or a plug-in that cannot be imported or built. `on_failure(name)` counts each failure."""
    return Enrichers((_build(entry) for entry in parse_enrichers(setting)), on_failure=on_failure)


def _build(entry: str) -> object:
    entry = BUILT_IN.get(entry, entry)
    if ":" not in entry:
        raise errors.PreconditionError(
            f"{SETTING}: unknown enricher {entry!r}; built in: {', '.join(sorted(BUILT_IN))}, or your own as "
            "'module:attribute'",
            reason="UNKNOWN_ENRICHER",
        )
    module_name, _, attribute = entry.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
        return factory()
    except Exception as exc:  # noqa: BLE001 - any failure to import or build the plug-in, reported with its name
        raise errors.PreconditionError(
            f"{SETTING}: enricher {entry!r} could not be built ({type(exc).__name__}: {exc})",
            reason="ENRICHER_UNAVAILABLE",
        ) from exc
