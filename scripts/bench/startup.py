"""Start-up and freshness of the query service at collection size (issue: scale).

For each size N (one-chunk documents of real text: SciFact sentences and the shared documents'
sentences), the bench bulk-loads a milvus-lite collection (scripts/bench/bulk.py, a bench-only
path; vectors are 256 embedded texts plus small noise, renormalised, so the bench does not embed
N texts) and measures, in this process:

  * start to SERVING: building the query service's components over the collection (the
    registry follower's paged scan of every ACTIVE document, then the rank_bm25 index's paged
    scan of every chunk), with the process RSS before and after (per chunk);
  * freshness: with the background follower running (RAGRPC_REGISTRY_FOLLOW_INTERVAL_S), the time
    from an acknowledged IngestPipeline.ingest of a new document to its first BM25 hit, and from an
    acknowledged delete to its disappearance (median of 5 each);
  * a hybrid Retrieve right after start (the index is complete: it never waits for maintenance).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
import statistics
import tempfile
import time
from pathlib import Path

from ingest_service.app import build_components as build_ingest
from ingest_service.requests import DocumentSpecInput, IngestItem
from query_service.app import build_components as build_query
from query_service.retrieval_types import RetrievalQuery
from ragrpc.config import Settings
from ragrpc.embeddings import SentenceTransformerEmbedder
from ragrpc.store.factory import open_milvus_stores
from scripts.bench import bulk
from scripts.bench.common import BenchConfig, SectionResult, proc_status_kb
from scripts.bench.querydata import text_pool
from tests.support.milvus_server import start_milvus_lite

_BASE = 256


def _bulk_load(settings: Settings, embedder: SentenceTransformerEmbedder, texts: list[str]) -> float:
    stores = open_milvus_stores(settings, model_id=embedder.model_id, dimension=embedder.dimension, writer=True)
    base = embedder.embed_documents(texts[:_BASE])
    seconds = bulk.bulk_load(stores, settings.collection_prefix, texts, bulk.derived_vectors(base, len(texts)))
    stores.connection.reset()
    return seconds


async def _until(predicate, timeout_s: float = 30.0) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    while not await predicate():
        if time.perf_counter() - started > timeout_s:
            raise TimeoutError("not visible in time")
        await asyncio.sleep(0.01)
    return time.perf_counter() - started


async def _freshness(settings: Settings, embedder: SentenceTransformerEmbedder, query) -> dict[str, float]:  # type: ignore[no-untyped-def]
    stores = open_milvus_stores(settings, model_id=embedder.model_id, dimension=embedder.dimension, writer=True)
    ingest = build_ingest(settings, embedder, stores.chunks, stores.registry)
    tasks = query.start_background()
    added, deleted = [], []
    try:
        for i in range(5):
            word = f"freshnessprobe{i}x{int(time.time())}"
            spec = DocumentSpecInput(document_id=f"fresh-{i}-{word}", file_name="fresh.txt")
            await ingest.pipeline.ingest(IngestItem(bulk.TENANT, spec, f"A probe about {word}.".encode()))

            async def found(word: str = word) -> bool:
                result = await query.retrieval.retrieve(
                    RetrievalQuery(text=word, tenant=bulk.TENANT, mode="sparse", top_k=1)
                )
                return bool(result.hits)

            added.append(await _until(found))
            await ingest.documents.delete(bulk.TENANT, spec.document_id)

            async def gone(word: str = word) -> bool:
                result = await query.retrieval.retrieve(
                    RetrievalQuery(text=word, tenant=bulk.TENANT, mode="sparse", top_k=1)
                )
                return not result.hits

            deleted.append(await _until(gone))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await ingest.lifecycle.close()
        ingest.shutdown()
    return {"ingest_to_searchable_s": statistics.median(added), "delete_to_gone_s": statistics.median(deleted)}


def _measure(size: int, texts: list[str], embedder: SentenceTransformerEmbedder, result: SectionResult) -> None:
    with tempfile.TemporaryDirectory(prefix="ragrpc-startup-") as tmp:
        server = start_milvus_lite(Path(tmp))
        try:
            settings = dataclasses.replace(
                Settings(), milvus_uri=server.uri, collection_prefix=f"startup{size}", workers=2
            )
            load_s = _bulk_load(settings, embedder, texts[:size])
            stores = open_milvus_stores(
                settings, model_id=embedder.model_id, dimension=embedder.dimension, writer=False
            )
            gc.collect()
            rss_before = proc_status_kb(os.getpid()).get("VmRSS", 0)
            started = time.perf_counter()
            query = build_query(settings, embedder, stores.chunks, stores.registry)
            serving_s = time.perf_counter() - started
            gc.collect()
            rss_after = proc_status_kb(os.getpid()).get("VmRSS", 0)
            fresh = asyncio.run(_freshness(settings, embedder, query))
            query.executor.shutdown(wait=False)
        finally:
            server.stop()
    label = f"{size // 1000}k docs"
    result.add(f"{label}: start to SERVING (registry + BM25 load)", serving_s, "s", note=f"bulk load {load_s:.0f} s")
    result.add(f"{label}: query RSS growth per chunk", (rss_after - rss_before) * 1024 / size, "bytes")
    result.add(f"{label}: acknowledged ingest -> BM25-searchable (median of 5)", fresh["ingest_to_searchable_s"], "s")
    result.add(f"{label}: acknowledged delete -> gone (median of 5)", fresh["delete_to_gone_s"], "s")
    result.data[str(size)] = {"serving_s": serving_s, "load_s": load_s, "rss_kb": [rss_before, rss_after], **fresh}


def run(config: BenchConfig, sizes: tuple[int, ...] = ()) -> SectionResult:
    chosen = sizes or ((2_000,) if config.quick else (10_000, 100_000))
    result = SectionResult("startup")
    embedder = SentenceTransformerEmbedder(backend="torch")
    embedder.warm_up()
    texts = text_pool(max(chosen))
    for size in chosen:
        _measure(size, texts, embedder, result)
    result.notes.append(
        "one-chunk documents on a milvus-lite server; start = building the query components "
        "(registry follower load + rank_bm25 load), in this process"
    )
    return result
