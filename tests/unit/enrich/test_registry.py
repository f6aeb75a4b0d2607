"""The enricher protocols and their registry: RAGRPC_ENRICHERS builds the set (built-in names, a user's own
as module:attribute), the ingest pipeline and the retrieval pipeline call it and know no domain, and an
enricher that fails costs only its own contribution: logged, counted, named in the document's metadata."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

import numpy as np
import pytest

from ingest_service.app import build_components as build_ingest
from ingest_service.requests import DocumentSpecInput, IngestItem
from query_service.retrieval import RetrievalPipeline
from query_service.retrieval_types import RetrievalQuery
from ragrpc import errors
from ragrpc.config import Settings
from ragrpc.enrich import (
    DocumentEnrichment,
    DocumentSample,
    Enrichers,
    QueryAnalysis,
    TitleSuggestion,
    build_enrichers,
)
from ragrpc.enrich.filings import FilingsEnricher
from ragrpc.enrich.language import LanguageEnricher
from ragrpc.enrich.registry import BUILT_IN, parse_enrichers
from ragrpc.models import ScoredChunk
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.store.filters import FilterExpr
from ragrpc.store.metadata_fields import MetadataFields
from ragrpc.store.request_filter import MetadataCondition
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry

HERE = __name__  # "tests.unit.enrich.test_registry": the module of the plug-ins below


class HeronEnricher:
    """A user's own enricher: documents that mention herons are about birds."""

    name = "herons"

    def enrich(self, document: DocumentSample) -> DocumentEnrichment:
        if "heron" not in document.first_pages.lower():
            return DocumentEnrichment()
        return DocumentEnrichment({"topic": "birds"}, TitleSuggestion("Heron notes", "heron facts", frozenset()))

    def header_terms(self, metadata: Mapping[str, str], title: str) -> str:
        return "about birds" if metadata.get("topic") == "birds" else ""

    def analyse(self, question: str) -> QueryAnalysis:
        implied = {"topic": ("birds",)} if "heron" in question.lower() else {}
        return QueryAnalysis(sparse_terms=("birds",) if implied else (), filters=implied)


class BrokenEnricher:
    name = "broken"

    def enrich(self, document: DocumentSample) -> DocumentEnrichment:
        raise RuntimeError("cannot read this")

    def header_terms(self, metadata: Mapping[str, str], title: str) -> str:
        raise RuntimeError("cannot say")

    def analyse(self, question: str) -> QueryAnalysis:
        raise RuntimeError("cannot analyse")


class WrongTypesEnricher:
    name = "wrong"

    def enrich(self, document: DocumentSample) -> DocumentEnrichment:
        return DocumentEnrichment({"pages": 3})  # type: ignore[dict-item]

    def header_terms(self, metadata: Mapping[str, str], title: str) -> str:
        return 42  # type: ignore[return-value]


def make_herons() -> HeronEnricher:
    return HeronEnricher()


def test_the_setting_names_built_in_enrichers_in_order_and_none_by_default() -> None:
    assert Settings().enrichers == "" and build_enrichers("").names == ()
    assert parse_enrichers(" none ") == () and parse_enrichers("filings, language,filings") == ("filings", "language")
    chosen = build_enrichers("language,filings")
    assert chosen.names == ("language", "filings")
    assert set(BUILT_IN) == {"filings", "language"}
    assert Settings.from_env({"RAGRPC_ENRICHERS": "filings"}).enrichers == "filings"


def test_a_users_own_enricher_is_named_by_module_and_attribute() -> None:
    assert build_enrichers(f"{HERE}:HeronEnricher").names == ("herons",)
    assert build_enrichers(f"filings,{HERE}:make_herons").names == ("filings", "herons")


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("filing", "unknown enricher 'filing'; built in: filings, language"),
        ("no.such.module:Thing", "could not be built (ModuleNotFoundError"),
        (f"{HERE}:NoSuchThing", "could not be built (AttributeError"),
        (f"{HERE}:HERE", "could not be built (TypeError"),  # a string is not callable
        (f"{HERE}:FACTS", "is neither a DocumentEnricher"),
    ],
)
def test_a_setting_that_names_no_enricher_stops_the_service_with_the_reason(setting: str, says: str) -> None:
    with pytest.raises(errors.PreconditionError) as refused:
        build_enrichers(setting)
    assert says in refused.value.message and refused.value.message.startswith("RAGRPC_ENRICHERS: ")


FACTS = dict  # callable, but what it builds is neither protocol


def test_facts_of_several_enrichers_merge_the_first_wins_and_header_terms_join_in_order() -> None:
    class Second:
        name = "second"

        def enrich(self, document: DocumentSample) -> DocumentEnrichment:
            return DocumentEnrichment(
                {"topic": "ponds", "region": "north"}, TitleSuggestion("Other", "second", frozenset())
            )

        def header_terms(self, metadata: Mapping[str, str], title: str) -> str:
            return "northern ponds"

    enrichers = Enrichers([HeronEnricher(), Second()])
    found = enrichers.enrich(DocumentSample("Herons wade in the pond."))
    assert dict(found.facts) == {"topic": "birds", "region": "north"} and found.failed == ()
    assert found.title is not None and found.title.text == "Heron notes"
    assert enrichers.header_terms({"topic": "birds"}, "t") == ("about birds northern ponds", ())
    assert Enrichers().enrich(DocumentSample("x")).facts == {} and Enrichers().header_terms({}, "t") == ("", ())


def test_a_failing_enricher_costs_only_its_own_contribution(caplog: pytest.LogCaptureFixture) -> None:
    enrichers = Enrichers([BrokenEnricher(), HeronEnricher(), WrongTypesEnricher()])
    with caplog.at_level(logging.WARNING, logger="ragrpc.enrich.registry"):
        found = enrichers.enrich(DocumentSample("A heron stood still."))
        terms = enrichers.header_terms(dict(found.facts), "Heron notes")
        analysis = enrichers.analyse("where do herons nest?")
    assert dict(found.facts) == {"topic": "birds"} and found.failed == ("broken", "wrong")
    assert terms == ("about birds", ("broken", "wrong"))
    assert analysis.sparse_terms == ("birds",) and dict(analysis.filters) == {"topic": ("birds",)}
    assert enrichers.failures == {"broken": 3, "wrong": 2}
    messages = [r.getMessage() for r in caplog.records]
    assert any("enricher broken failed in enrich (RuntimeError: cannot read this)" in m for m in messages)
    assert any("enricher wrong failed in enrich (TypeError: fact 'pages'" in m for m in messages)


def test_each_failure_is_counted_in_the_services_metric() -> None:
    from ragrpc.metrics import Metrics

    metrics = Metrics()
    enrichers = Enrichers(
        [BrokenEnricher(), HeronEnricher()], on_failure=lambda name: metrics.enricher_failures.labels(name).inc()
    )
    enrichers.enrich(DocumentSample("A heron stood still."))
    assert metrics.enricher_failures.labels("broken")._value.get() == 1


def _settings(**changes: object) -> Settings:
    values: dict[str, object] = {"workers": 2, "sparse_backend": "rank_bm25", **changes}
    return dataclasses.replace(Settings(), **values)  # type: ignore[arg-type]


class RecordingEmbedder(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__(dimension=64)
        self.texts: list[str] = []
        self.queries: list[str] = []

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        self.texts.extend(texts)
        return super().embed_documents(texts)

    def embed_query(self, text: str) -> np.ndarray:
        self.queries.append(text)
        return super().embed_query(text)


async def test_a_document_an_enricher_fails_on_is_ingested_and_says_so() -> None:
    embedder, chunks, registry = RecordingEmbedder(), InMemoryChunkStore(), InMemoryDocumentRegistry()
    ingest = build_ingest(
        _settings(enrichers=f"{HERE}:BrokenEnricher,{HERE}:HeronEnricher"), embedder, chunks, registry
    )
    outcome = await ingest.pipeline.ingest(
        IngestItem("t1", DocumentSpecInput(document_id="d1", file_name="d1.txt"), b"A grey heron waits by the river.")
    )
    assert outcome.chunks_written == 1
    record = registry.get("t1", "d1")
    assert record is not None and record.metadata["enrichers_failed"] == "broken"
    assert record.metadata["topic"] == "birds" and record.metadata["header_terms"] == "about birds"
    assert record.title == "Heron notes" and record.metadata["title_source"] == "heron facts"
    stored = [c for page in chunks.scan_chunks(f.eq(s.DOCUMENT_ID, "d1")) for c in page]
    assert stored[0].metadata == {"topic": "birds", "header_terms": "about birds"}  # the failure is the document's
    assert embedder.texts[0].split("\n")[0] == "Heron notes | about birds"
    pipeline_enrichers = ingest.pipeline._enrichers  # type: ignore[attr-defined]
    assert pipeline_enrichers.failures == {"broken": 2}
    ingest.shutdown()


async def test_the_requests_metadata_wins_over_an_enrichers_facts_and_header_terms() -> None:
    embedder, chunks, registry = RecordingEmbedder(), InMemoryChunkStore(), InMemoryDocumentRegistry()
    ingest = build_ingest(_settings(enrichers=f"{HERE}:HeronEnricher"), embedder, chunks, registry)
    spec = DocumentSpecInput(
        document_id="d1", file_name="d1.txt", title="Field notes", metadata={"topic": "wading birds"}
    )
    await ingest.pipeline.ingest(IngestItem("t1", spec, b"A grey heron waits by the river."))
    stored = [c for page in chunks.scan_chunks(f.eq(s.DOCUMENT_ID, "d1")) for c in page]
    assert stored[0].metadata == {"topic": "wading birds"}  # header terms from the request's topic: none
    assert embedder.texts[0].split("\n")[0] == "Field notes"
    spec = DocumentSpecInput(document_id="d2", file_name="d2.txt", metadata={"header_terms": "Chapter 3 herons"})
    await ingest.pipeline.ingest(IngestItem("t1", spec, b"A grey heron waits by the river."))
    stored = [c for page in chunks.scan_chunks(f.eq(s.DOCUMENT_ID, "d2")) for c in page]
    assert stored[0].metadata == {"topic": "birds", "header_terms": "Chapter 3 herons"}
    assert embedder.texts[-1].split("\n")[0] == "Heron notes | Chapter 3 herons"
    ingest.shutdown()


class RecordingSparse:
    name = "recording"

    def __init__(self) -> None:
        self.queries: list[str] = []
        self.filters: list[FilterExpr] = []

    def search(
        self, query: str, tenant: str, expr: FilterExpr, limit: int, document_ids: list[str] | None = None
    ) -> list[ScoredChunk]:
        self.queries.append(query)
        self.filters.append(expr)
        return []


class AllVisible:
    ready = True

    def generations(self, keys):  # type: ignore[no-untyped-def]
        return {}


def _retrieval(chunks: InMemoryChunkStore, analyser: object, sparse: RecordingSparse, embedder: HashingEmbedder):  # type: ignore[no-untyped-def]
    from concurrent.futures import ThreadPoolExecutor

    return RetrievalPipeline(
        embedder=embedder,
        chunks=chunks,
        visibility=AllVisible(),
        sparse=sparse,
        reranker=None,
        executor=ThreadPoolExecutor(2),
        query_analyser=analyser,  # type: ignore[arg-type]
    )


async def test_the_analysis_terms_go_to_the_bm25_query_only_and_its_filters_where_the_request_sets_none() -> None:
    chunks = InMemoryChunkStore(metadata_fields=MetadataFields(("topic",)))
    sparse, embedder = RecordingSparse(), RecordingEmbedder()
    retrieval = _retrieval(chunks, build_enrichers(f"filings,{HERE}:HeronEnricher"), sparse, embedder)
    await retrieval.retrieve(RetrievalQuery(text="heron counts in FY17", tenant="t1"))
    assert sparse.queries[-1] == "heron counts in FY17 FY2017 birds" and embedder.queries[-1] == "heron counts in FY17"
    assert 'meta_topic in ["birds"]' in sparse.filters[-1].render()
    asked = RetrievalQuery(text="heron counts", tenant="t1", metadata=[MetadataCondition("topic", ("fish",))])
    await retrieval.retrieve(asked)
    assert 'meta_topic in ["fish"]' in sparse.filters[-1].render() and "birds" not in sparse.filters[-1].render()
    # a key the collection does not declare: the implied filter does not apply
    undeclared = _retrieval(InMemoryChunkStore(), build_enrichers(f"{HERE}:HeronEnricher"), sparse, embedder)
    await undeclared.retrieve(RetrievalQuery(text="heron counts", tenant="t1"))
    assert "topic" not in sparse.filters[-1].render() and sparse.queries[-1] == "heron counts birds"
    # no analyser, or a failing one: the question as asked
    for analyser in (None, build_enrichers(f"{HERE}:BrokenEnricher")):
        await _retrieval(chunks, analyser, sparse, embedder).retrieve(RetrievalQuery(text="FY17 herons", tenant="t1"))
        assert sparse.queries[-1] == "FY17 herons"


def test_the_built_in_enrichers_are_both_protocols_where_they_have_both_sides() -> None:
    from ragrpc.enrich import DocumentEnricher, QueryAnalyser

    assert isinstance(FilingsEnricher(), DocumentEnricher) and isinstance(FilingsEnricher(), QueryAnalyser)
    assert isinstance(LanguageEnricher(), DocumentEnricher) and not isinstance(LanguageEnricher(), QueryAnalyser)
    assert isinstance(Enrichers(), QueryAnalyser) and Enrichers().analyse("FY17") == QueryAnalysis()


def test_the_readmes_own_enricher_works_as_shown(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    start = readme.index("# mycompany/enrich.py")
    code = readme[start : readme.index("```", start)]
    (tmp_path / "mycompany").mkdir()
    (tmp_path / "mycompany" / "__init__.py").write_text("")
    (tmp_path / "mycompany" / "enrich.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    enrichers = build_enrichers("mycompany.enrich:DepartmentEnricher")
    found = enrichers.enrich(DocumentSample("Q3 travel\nDepartment: Sales\n\nTravel costs rose.", file_name="q3.txt"))
    assert enrichers.enrich(DocumentSample("Department: Marketing\nCosts rose.")).facts == {}
    assert dict(found.facts) == {"department": "sales"} and found.failed == ()
    assert enrichers.header_terms(dict(found.facts), "Q3 travel") == ("sales department", ())
    assert dict(enrichers.analyse("legal fees in Q3").filters) == {"department": ("legal",)}
