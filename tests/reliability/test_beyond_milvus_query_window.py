"""The large real run of "correct at any size": more documents than Milvus answers in one query
(16,384), ingested through the real ingest pipeline into a real milvus-lite server with the
default page size, then listed whole, followed whole by a freshly started query service (every
document in its visibility map and BM25 index, a sample found by sparse and dense search), and
recovered whole. The same properties at a small page size run in the regular suite
(tests/integration/test_beyond_one_page.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest

from ingest_service.app import build_components as build_ingest
from ingest_service.requests import DocumentSpecInput, IngestItem
from query_service.app import build_components as build_query
from query_service.retrieval_types import RetrievalQuery
from ragrpc.config import Settings
from ragrpc.store.factory import open_milvus_stores
from ragrpc.store.paging import MAX_QUERY_WINDOW
from ragrpc.testing import HashingEmbedder
from ragrpc.testing.invariants import check_store
from tests.support.milvus_server import start_milvus_lite

pytestmark = pytest.mark.reliability
DOCUMENTS = MAX_QUERY_WINDOW + 3_616  # the 20,000 documents of the report that found 3,616 missing


def _word(i: int) -> str:
    return "w" + "".join("qxzjvkbfgh"[int(d)] for d in f"{i:05d}")


async def test_twenty_thousand_documents(tmp_path: Path) -> None:
    server = start_milvus_lite(tmp_path)
    try:
        embedder = HashingEmbedder(dimension=1024)
        settings = dataclasses.replace(
            Settings(), milvus_uri=server.uri, collection_prefix="big", workers=2, sparse_backend="rank_bm25"
        )
        stores = open_milvus_stores(settings, model_id=embedder.model_id, dimension=embedder.dimension, writer=True)
        ingest = build_ingest(settings, embedder, stores.chunks, stores.registry)
        started = time.monotonic()
        for first in range(0, DOCUMENTS, 256):
            numbers = range(first, min(first + 256, DOCUMENTS))
            specs = [(i, DocumentSpecInput(document_id=f"d{i:05d}", file_name="n.txt")) for i in numbers]
            items = [IngestItem("t", spec, f"About {_word(i)}.".encode()) for i, spec in specs]
            await asyncio.gather(*(ingest.pipeline.ingest(item) for item in items))
        print(f"ingested {DOCUMENTS} documents in {time.monotonic() - started:.0f}s")

        listed, token = 0, ""
        while True:
            page = ingest.documents.list_page("t", page_size=1000, page_token=token)
            listed += len(page.documents)
            token = page.next_page_token
            if not token:
                break
        assert listed == DOCUMENTS

        started = time.monotonic()
        query = build_query(settings, embedder, stores.chunks, stores.registry)
        print(f"query components (registry + BM25 load) in {time.monotonic() - started:.1f}s")
        assert query.follower.document_count == DOCUMENTS
        for i in range(0, DOCUMENTS, DOCUMENTS // 97):
            sparse = await query.retrieval.retrieve(RetrievalQuery(text=_word(i), tenant="t", mode="sparse", top_k=1))
            assert [h.chunk.document_id for h in sparse.hits] == [f"d{i:05d}"]
            # hashed word vectors collide across 20,000 words: the document's own text, among its ties
            text = f"About {_word(i)}."
            dense = await query.retrieval.retrieve(RetrievalQuery(text=text, tenant="t", mode="dense", top_k=50))
            assert f"d{i:05d}" in [h.chunk.document_id for h in dense.hits]

        counts = ingest.lifecycle.recover()
        assert not any(counts.values())
        report = check_store(stores.chunks, stores.registry, tenant="t")
        assert report.documents == DOCUMENTS and not report.problems, report.problems[:5]
        await ingest.lifecycle.close()
        ingest.shutdown()
        query.executor.shutdown(wait=False)
    finally:
        server.stop()
