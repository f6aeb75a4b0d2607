"""A document's title is one a person can tell it by, with the choice recorded; facts of filings
(organisation, document type, fiscal period) reach the record's and the chunks' metadata and the
context header."""

from __future__ import annotations

import dataclasses

import numpy as np

from ingest_service.app import build_components
from ingest_service.document_facts import choose_title
from ingest_service.requests import DocumentSpecInput, IngestItem
from ragrpc.config import Settings
from ragrpc.models import Block, BlockKind, DocumentMetadata, ExtractedDocument
from ragrpc.store import filters as f
from ragrpc.store import schema as s
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


def _doc(blocks: list[Block], title: str = "") -> ExtractedDocument:
    return ExtractedDocument("application/pdf", blocks, metadata=DocumentMetadata(title=title))


def test_an_identifier_title_is_replaced_and_the_choice_recorded() -> None:
    cover = _doc([Block(BlockKind.PARAGRAPH, COVER)], title="0001018724-18-000005")
    facts = {"organization": "Amazon.com, Inc.", "document_type": "10-K", "fiscal_period": "FY2017"}
    assert choose_title("", cover, "amzn-10k.pdf", facts) == ("Amazon.com, Inc. 10-K FY2017", "filing facts")
    assert choose_title("My own title", cover, "amzn-10k.pdf", facts) == ("My own title", "request")
    named = _doc([Block(BlockKind.PARAGRAPH, "text")], title="Attention Is All You Need")
    assert choose_title("", named, "1706.03762.pdf", {}) == ("Attention Is All You Need", "file metadata")
    headed = _doc([Block(BlockKind.HEADING, "Ducks"), Block(BlockKind.PARAGRAPH, "Ducks swim.")])
    assert choose_title("", headed, "ducks.md", {}) == ("Ducks", "first heading")
    plain = _doc([Block(BlockKind.PARAGRAPH, "Quarterly field notes\nThe herons came back in March.")])
    assert choose_title("", plain, "notes.txt", {}) == ("Quarterly field notes", "first line")
    # a filing's first heading that names no company gives way to its facts; one that does is kept
    facts_amd = {"organization": "Advanced Micro Devices, Inc.", "ticker": "AMD", "document_type": "10-K"}
    sec = _doc([Block(BlockKind.HEADING, "SECURITIES AND EXCHANGE COMMISSION"), Block(BlockKind.PARAGRAPH, COVER)])
    assert choose_title("", sec, "amd.pdf", facts_amd) == ("Advanced Micro Devices, Inc. (AMD) 10-K", "filing facts")
    for heading in ("AMD Reports Fourth Quarter and Full Year 2022 Financial Results", "Advanced Micro Devices 2022"):
        named_filing = _doc([Block(BlockKind.HEADING, heading), Block(BlockKind.PARAGRAPH, COVER)])
        assert choose_title("", named_filing, "amd.pdf", facts_amd) == (heading, "first heading")
    empty = _doc([Block(BlockKind.PARAGRAPH, "1234 5678")])
    assert choose_title("", empty, "scan_0042.pdf", {}) == ("scan_0042", "file name")


class RecordingEmbedder(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__(dimension=64)
        self.texts: list[str] = []

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        self.texts.extend(texts)
        return super().embed_documents(texts)


async def test_filing_facts_reach_metadata_chunks_and_the_header() -> None:
    embedder = RecordingEmbedder()
    chunks, registry = InMemoryChunkStore(), InMemoryDocumentRegistry()
    settings = dataclasses.replace(Settings(), workers=2, chunk_size_tokens=60, chunk_overlap_tokens=0)
    ingest = build_components(settings, embedder, chunks, registry)
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


async def test_a_retrieve_filtered_by_organisation_and_period_keeps_only_those_documents() -> None:
    from query_service.app import build_components as build_query
    from query_service.app import load_follower
    from query_service.convert import retrieval_query
    from ragrpc.v1 import retrieve_pb2

    chunks, registry, embedder = InMemoryChunkStore(), InMemoryDocumentRegistry(), HashingEmbedder()
    settings = dataclasses.replace(Settings(), workers=2, sparse_backend="rank_bm25")
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
    for mode in (retrieve_pb2.RETRIEVAL_MODE_DENSE, retrieve_pb2.RETRIEVAL_MODE_SPARSE):
        options = retrieve_pb2.RetrievalOptions(
            mode=mode,
            filter=retrieve_pb2.MetadataFilter(organizations=["Amazon.com, Inc."], fiscal_periods=["FY2017"]),
        )
        converted = retrieval_query("net sales increased", options, "default", default_top_k=10, default_candidates=50)
        result = await query.retrieval.retrieve(converted)
        assert {h.chunk.document_id for h in result.hits} == {"amzn-2017"}, mode
    query.executor.shutdown(wait=False)
    ingest.shutdown()
