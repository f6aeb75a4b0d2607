"""Throughput (requests/second) and latency percentiles of the query service at 1, 4 and
16 concurrent streams (grpc.aio client, one channel), Retrieve (hybrid) and Ask
(extractive), each level run for a fixed duration over the 10k-chunk HNSW collection
(1k with --quick)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import sys
import time
from typing import Any

import grpc

from ragrpc.config import Settings
from ragrpc.embeddings import SentenceTransformerEmbedder
from ragrpc.v1 import retrieve_pb2, retrieve_pb2_grpc
from scripts.bench import querydata as qd
from scripts.bench.common import BenchConfig, SectionResult, proc_status_kb, summary_ms
from scripts.bench.query import CANDIDATES, MODES, TOP_K, bench_queries
from scripts.processes import Stack


async def one_call(stub: Any, kind: str, text: str) -> None:
    if kind == "Retrieve":
        options = retrieve_pb2.RetrievalOptions(
            top_k=TOP_K, candidates=CANDIDATES, mode=MODES["hybrid"], collection=qd.COLLECTION
        )
        call = stub.Retrieve(retrieve_pb2.RetrieveRequest(query=text, options=options), timeout=120)
    else:
        options = retrieve_pb2.RetrievalOptions(top_k=5, candidates=CANDIDATES, collection=qd.COLLECTION)
        call = stub.Ask(retrieve_pb2.AskRequest(query=text, options=options), timeout=120)
    async for _ in call:
        pass


async def load_level(address: str, kind: str, streams: int, seconds: float, queries: list[str]) -> dict[str, float]:
    """`streams` workers issue calls back to back for `seconds`; calls still running at the
    end are awaited and counted (their latency is real)."""
    cycle = itertools.cycle(queries)
    latencies: list[float] = []
    errors = 0
    async with grpc.aio.insecure_channel(address) as channel:
        stub = retrieve_pb2_grpc.RetrieveServiceStub(channel)
        await one_call(stub, kind, queries[0])  # connect and warm
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal errors
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                try:
                    await one_call(stub, kind, next(cycle))
                except grpc.aio.AioRpcError:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(streams)))
        elapsed = time.perf_counter() - started
    stats = summary_ms(latencies)
    return {
        "streams": float(streams),
        "requests": float(len(latencies)),
        "errors": float(errors),
        "seconds": elapsed,
        "req_per_s": len(latencies) / elapsed,
        **{k: stats[k] for k in ("p50", "p95", "p99")},
    }


def run(config: BenchConfig, vector_backend: str = "onnx-int8") -> SectionResult:
    result = SectionResult("concurrency")
    size = 1_000 if config.quick else 10_000
    settings = Settings.from_env()
    embedder = SentenceTransformerEmbedder(
        settings.embedding_model, backend=settings.embedding_backend, onnx_cache_dir=config.onnx_cache
    )
    queries = bench_queries(200)
    texts, matrix, _ = qd.cached_texts_and_vectors(config, size, vector_backend)
    with Stack(config.bench_dir / "query-stack") as stack:
        stack.start_milvus()
        hnsw = dataclasses.replace(
            settings,
            milvus_uri=stack.milvus_uri,
            collection_prefix=qd.prefix_for(size, "HNSW"),
            index_type="HNSW",
        )
        qd.ensure_collection(hnsw, embedder.model_id, texts, matrix)
        address = stack.start_query(
            "query-concurrency",
            {"RAGRPC_COLLECTION_PREFIX": hnsw.collection_prefix, "RAGRPC_INDEX_TYPE": "HNSW"},
        )
        pid = stack.processes["query-concurrency"].pid
        rss_before = proc_status_kb(pid).get("VmRSS", 0)
        rows: dict[str, list[dict[str, float]]] = {}
        for kind in ("Retrieve", "Ask"):
            for streams in config.concurrency_levels:
                print(f"  {kind} x{streams} for {config.concurrency_seconds:.0f} s", file=sys.stderr, flush=True)
                row = asyncio.run(load_level(address, kind, streams, config.concurrency_seconds, queries))
                rows.setdefault(kind, []).append(row)
        status = proc_status_kb(pid)
    result.data.update(
        levels=rows,
        size=size,
        rss_kb={"before": rss_before, "after": status.get("VmRSS", 0), "peak": status.get("VmHWM", 0)},
    )
    for kind, levels in rows.items():
        single = levels[0]["req_per_s"]
        for row in levels:
            result.add(
                f"{kind} x{int(row['streams'])}",
                row["req_per_s"],
                "req/s",
                ratio=row["req_per_s"] / single if single else None,
                versus="1 stream",
                note=f"p50 {row['p50']:.0f} ms, p99 {row['p99']:.0f} ms, {int(row['requests'])} calls, "
                f"{int(row['errors'])} errors",
            )
    result.add(
        "query RSS before -> after",
        (status.get("VmRSS", 0) - rss_before) / 1024,
        "MiB",
        note=f"{rss_before / 1024:.0f} -> {status.get('VmRSS', 0) / 1024:.0f} MiB, peak "
        f"{status.get('VmHWM', 0) / 1024:.0f} MiB",
    )
    result.notes.append(
        f"{size} chunks, HNSW, the service's default sparse backend, hybrid Retrieve (top_k {TOP_K}) and Ask "
        "(top_k 5, extractive); "
        f"{config.concurrency_seconds:.0f} s per level; a 2-core machine shared with the client"
    )
    return result
