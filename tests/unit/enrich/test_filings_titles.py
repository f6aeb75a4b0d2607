"""The filings enricher at ingestion: its facts reach the record's and the chunks' metadata and the
context header; a filing whose file states no title gets one made of its facts; the deprecated
MetadataFilter fields select by them on a collection that declares their keys."""

from __future__ import annotations

import dataclasses

import numpy as np

from ingest_service.app import build_components
from ingest_service.document_facts import choose_title
from ingest_service.requests import DocumentSpecInput, IngestItem
from ragrpc.config import Settings
from ragrpc.enrich import DocumentSample
from ragrpc.enrich.filings import FilingsEnricher, facts_phrase, heading_words
from ragrpc.models import Block, BlockKind, DocumentMetadata, ExtractedDocument
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.store.metadata_fields import MetadataFields
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry

COVER = """UNITED STATES
SECURITIES AND EXCHANGE COMMISSION
Washington, D.C. 20549
FORM 10-K
(Mark One)
☒ ANNUAL REPORT PURSUANT TO SECTION 13 OR 15(d) OF THE SECURITIES EXCHANGE ACT OF 1934
For the fiscal year ended December 31, 2017
Commission File No. 000-22513
AMAZON.COM, INC.
(Exact name of registrant as specified in its charter)
Delaware 91-1646860
"""
FACT_KEYS = "organization,ticker,document_type,fiscal_period"


def _doc(blocks: list[Block], title: str = "") -> ExtractedDocument:
    return ExtractedDocument("application/pdf", blocks, metadata=DocumentMetadata(title=title))


def _suggestion(facts: dict[str, str]):  # type: ignore[no-untyped-def]
    from ragrpc.enrich import TitleSuggestion

    return TitleSuggestion(facts_phrase(facts), "filing facts", heading_words(facts))


def test_a_filings_title_is_made_of_its_facts_unless_its_heading_names_the_company() -> None:
    cover = _doc([Block(BlockKind.PARAGRAPH, COVER)], title="0001018724-18-000005")
    found = FilingsEnricher().enrich(DocumentSample(COVER, title="0001018724-18-000005"))
    assert dict(found.facts) == {"organization": "Amazon.com, Inc.", "document_type": "10-K", "fiscal_period": "FY2017"}
    assert found.title is not None
    assert choose_title("", cover, "amzn-10k.pdf", found.title) == ("Amazon.com, Inc. 10-K FY2017", "filing facts")
    assert choose_title("My own title", cover, "amzn-10k.pdf", found.title) == ("My own title", "request")
    # a filing's first heading that names no company gives way to its facts; one that does is kept
    facts_amd = {"organization": "Advanced Micro Devices, Inc.", "ticker": "AMD", "document_type": "10-K"}
    sec = _doc([Block(BlockKind.HEADING, "SECURITIES AND EXCHANGE COMMISSION"), Block(BlockKind.PARAGRAPH, COVER)])
    expected = ("Advanced Micro Devices, Inc. (AMD) 10-K", "filing facts")
    assert choose_title("", sec, "amd.pdf", _suggestion(facts_amd)) == expected
    for heading in ("AMD Reports Fourth Quarter and Full Year 2022 Financial Results", "Advanced Micro Devices 2022"):
        named_filing = _doc([Block(BlockKind.HEADING, heading), Block(BlockKind.PARAGRAPH, COVER)])
        assert choose_title("", named_filing, "amd.pdf", _suggestion(facts_amd)) == (heading, "first heading")
    # no organisation, or no type and no period: no title of facts
    assert FilingsEnricher().enrich(DocumentSample("Notes on ducks.\n" * 30)).title is None


def test_the_facts_of_a_filing_follow_the_title_with_the_ticker_in_parentheses() -> None:
    amd = {"organization": "Advanced Micro Devices, Inc.", "ticker": "AMD", "document_type": "10-K"}
    amd["fiscal_period"] = "FY2022"
    assert facts_phrase(amd) == "Advanced Micro Devices, Inc. (AMD) 10-K FY2022"
    assert FilingsEnricher().header_terms(amd, "Annual Report") == "Advanced Micro Devices, Inc. (AMD) 10-K FY2022"
    # what the title already says is not repeated; a ticker only as a whole word of the title or name
    assert facts_phrase(amd, said="AMD 10-K for fiscal 2022") == "Advanced Micro Devices, Inc. FY2022"
    assert FilingsEnricher().header_terms(amd, "AMD  10-K for fiscal 2022") == "Advanced Micro Devices, Inc. FY2022"
    assert facts_phrase({"organization": "AT&T Inc.", "ticker": "T"}) == "AT&T Inc."
    assert facts_phrase({"organization": "Caterpillar Inc.", "ticker": "CAT"}) == "Caterpillar Inc. (CAT)"
    assert facts_phrase({}) == "" and facts_phrase({"tags": "x"}) == ""
    assert facts_phrase({"organization": "Amazon.com, Inc.", "document_type": "10-K"}) == "Amazon.com, Inc. 10-K"


class RecordingEmbedder(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__(dimension=64)
        self.texts: list[str] = []

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        self.texts.extend(texts)
        return super().embed_documents(texts)


def _settings(**changes: object) -> Settings:
    values: dict[str, object] = {"workers": 2, "enrichers": "filings", **changes}
    return dataclasses.replace(Settings(), **values)  # type: ignore[arg-type]


async def test_filing_facts_reach_metadata_chunks_and_the_header() -> None:
    embedder = RecordingEmbedder()
    chunks, registry = InMemoryChunkStore(), InMemoryDocumentRegistry()
    ingest = build_components(_settings(chunk_size_tokens=60, chunk_overlap_tokens=0), embedder, chunks, registry)
    text = COVER + "\n\nItem 7. Net sales increased 31% to $177.9 billion in 2017.\n"
    spec = DocumentSpecInput(document_id="amzn-2017", file_name="0001018724-18-000005.txt")
    await ingest.pipeline.ingest(IngestItem("t1", spec, text.encode()))
    record = registry.get("t1", "amzn-2017")
    assert record is not None
    assert record.metadata["organization"] == "Amazon.com, Inc."
    assert record.metadata["document_type"] == "10-K" and record.metadata["fiscal_period"] == "FY2017"
    assert record.metadata["title_source"] in {"filing facts", "first line"}
    stored = [c for page in chunks.scan_chunks(f.eq(s.DOCUMENT_ID, "amzn-2017")) for c in page]
    assert stored and all(c.metadata.get("organization") == "Amazon.com, Inc." for c in stored)
    assert all("Amazon.com, Inc." in t.split("\n", 1)[0] and "FY2017" in t.split("\n", 1)[0] for t in embedder.texts)
    ingest.shutdown()


async def test_without_the_enricher_a_filing_is_a_document_like_any_other() -> None:
    embedder = RecordingEmbedder()
    chunks, registry = InMemoryChunkStore(), InMemoryDocumentRegistry()
    ingest = build_components(_settings(enrichers=""), embedder, chunks, registry)
    text = COVER + "\n\nItem 7. Net sales increased 31% to $177.9 billion in 2017.\n"
    spec = DocumentSpecInput(document_id="amzn-2017", file_name="0001018724-18-000005.txt")
    await ingest.pipeline.ingest(IngestItem("t1", spec, text.encode()))
    record = registry.get("t1", "amzn-2017")
    assert record is not None and "organization" not in record.metadata and "header_terms" not in record.metadata
    assert record.title == "UNITED STATES" and record.metadata["title_source"] == "first line"
    stored = [c for page in chunks.scan_chunks(f.eq(s.DOCUMENT_ID, "amzn-2017")) for c in page]
    assert stored and all(c.metadata == {} for c in stored)
    assert not any("FY2017" in t.split("\n", 1)[0] for t in embedder.texts)
    ingest.shutdown()


async def test_a_retrieve_filtered_by_organisation_and_period_keeps_only_those_documents() -> None:
    """The deprecated MetadataFilter fields and `metadata` alike, on a collection declaring the facts' keys."""
    from query_service.app import build_components as build_query
    from query_service.app import load_follower
    from query_service.convert import retrieval_query
    from ragrpc.v1 import retrieve_pb2

    fields = MetadataFields(tuple(FACT_KEYS.split(",")))
    chunks, registry, embedder = (
        InMemoryChunkStore(metadata_fields=fields),
        InMemoryDocumentRegistry(),
        HashingEmbedder(),
    )
    settings = _settings(sparse_backend="rank_bm25", metadata_filter_keys=FACT_KEYS)
    ingest = build_components(settings, embedder, chunks, registry)
    for document_id, cover in (
        ("amzn-2017", COVER),
        ("amzn-2016", COVER.replace("2017", "2016")),
        ("aapl-2017", COVER.replace("AMAZON.COM, INC.", "APPLE INC.")),
    ):
        spec = DocumentSpecInput(document_id=document_id, file_name=f"{document_id}.txt")
        body = f"{cover}\n\nItem 7. Net sales increased in the year.\n"
        await ingest.pipeline.ingest(IngestItem("default", spec, body.encode()))
    query = build_query(settings, embedder, chunks, registry)
    load_follower(query.follower)
    generic = {"organization": retrieve_pb2.MetadataValues(values=["Amazon.com, Inc."])}
    generic["fiscal_period"] = retrieve_pb2.MetadataValues(values=["FY2017"])
    for flt in (
        retrieve_pb2.MetadataFilter(organizations=["Amazon.com, Inc."], fiscal_periods=["FY2017"]),
        retrieve_pb2.MetadataFilter(metadata=generic),
    ):
        for mode in (retrieve_pb2.RETRIEVAL_MODE_DENSE, retrieve_pb2.RETRIEVAL_MODE_SPARSE):
            options = retrieve_pb2.RetrievalOptions(mode=mode, filter=flt)
            converted = retrieval_query(
                "net sales increased", options, "default", default_top_k=10, default_candidates=50
            )
            result = await query.retrieval.retrieve(converted)
            assert {h.chunk.document_id for h in result.hits} == {"amzn-2017"}, (mode, flt)
    query.executor.shutdown(wait=False)
    ingest.shutdown()
