"""Store searches with the rows still in milvus-lite's write-ahead log against the same rows after
flush(): why the ingest service flushes (ragrpc/store/wal_flusher.py).

Real bench texts and vectors (the query section's cached pool) are written the way ingestion
writes them, one document of a few chunks per insert, into a fresh milvus-lite server; then the
same queries run before and after one flush.
"""

from __future__ import annotations

import dataclasses
import shutil
import time

from ragrpc.config import Settings
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.store.factory import open_milvus_stores
from scripts.bench import querydata as qd
from scripts.bench.common import BenchConfig, SectionResult, load_scifact, ratio, summary_ms
from scripts.processes import Stack

CHUNKS_PER_INSERT = 3  # SciFact abstracts give 2-3 chunks each
QUERIES = 40


def run(config: BenchConfig, backend: str) -> SectionResult:
    result = SectionResult("wal")
    size = 2000 if config.quick else 10000
    texts, vectors, vector_backend = qd.cached_texts_and_vectors(config, size, backend)
    dataset = load_scifact()
    queries = list(dataset.judged_queries().values())[:QUERIES]
    query_vectors = vectors[: len(queries)]  # stored vectors as queries: exact top hits exist
    root = config.bench_dir / "wal-stack"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    with Stack(root) as stack:
        stack.start_milvus()
        settings = dataclasses.replace(Settings(), milvus_uri=stack.milvus_uri, collection_prefix="bench_wal")
        stores = open_milvus_stores(settings, model_id="bench", dimension=int(vectors.shape[1]), writer=True)
        started = time.perf_counter()
        for start in range(0, size, CHUNKS_PER_INSERT):
            stores.chunks.insert_chunks(qd.chunk_records(texts, vectors, start, min(size, start + CHUNKS_PER_INSERT)))
        insert_s = time.perf_counter() - started
        expr = f.and_(f.eq(s.TENANT, qd.TENANT), f.eq(s.COLLECTION, qd.COLLECTION))

        def timings() -> tuple[dict[str, float], dict[str, float]]:
            dense, bm25 = [], []
            for vector, text in zip(query_vectors, queries, strict=True):
                t = time.perf_counter()
                stores.chunks.search_dense(vector, expr, 100)
                dense.append(time.perf_counter() - t)
                t = time.perf_counter()
                stores.chunks.search_bm25(text, expr, 100)
                bm25.append(time.perf_counter() - t)
            return summary_ms(dense), summary_ms(bm25)

        wal_dense, wal_bm25 = timings()
        started = time.perf_counter()
        stores.connection.flush([f"bench_wal_{n}" for n in ("chunks", "documents", "jobs")])
        flush_s = time.perf_counter() - started
        sealed_dense, sealed_bm25 = timings()
        stores.connection.reset()
    result.data.update(
        {
            "rows": size,
            "insert_s": insert_s,
            "flush_s": flush_s,
            "wal": {"dense_ms": wal_dense, "bm25_ms": wal_bm25},
            "flushed": {"dense_ms": sealed_dense, "bm25_ms": sealed_bm25},
        }
    )
    tag = f"{size // 1000}k"
    result.add(f"{tag} search_dense p50, rows in WAL", wal_dense["p50"], "ms", note=f"p99 {wal_dense['p99']:.1f}")
    result.add(
        f"{tag} search_dense p50, after flush",
        sealed_dense["p50"],
        "ms",
        ratio=ratio(wal_dense["p50"], sealed_dense["p50"]),
        versus="WAL / flushed",
        note=f"p99 {sealed_dense['p99']:.1f}",
    )
    result.add(f"{tag} search_bm25 p50, rows in WAL", wal_bm25["p50"], "ms", note=f"p99 {wal_bm25['p99']:.1f}")
    result.add(
        f"{tag} search_bm25 p50, after flush",
        sealed_bm25["p50"],
        "ms",
        ratio=ratio(wal_bm25["p50"], sealed_bm25["p50"]),
        versus="WAL / flushed",
        note=f"p99 {sealed_bm25['p99']:.1f}",
    )
    result.add(f"{tag} flush", flush_s, "s", note=f"inserts of {CHUNKS_PER_INSERT} rows took {insert_s:.1f} s")
    result.notes.append(
        f"milvus-lite server, {size} pool chunks ({vector_backend} vectors) inserted {CHUNKS_PER_INSERT} per call as "
        f"ingestion writes them; {len(queries)} queries, top 100, tenant + collection filter; same rows before/after"
    )
    return result
