"""Query latency by layer at 10k and 100k chunks (1k with --quick).

Per query, in turn (so machine noise hits every layer alike): the query embedding alone,
the store's own searches (search_dense, search_bm25), exact numpy top-k over the same
vectors, the retrieval pipeline in this process (build_components(...).retrieval) and the
query service over gRPC (Retrieve dense / sparse / hybrid, time to first streamed chunk,
Ask time to first token with the extractive answerer). Then the dense index types
(FLAT / IVF_FLAT / HNSW: recall@10 against exact, p50), the sparse backends (milvus_bm25 vs
rank_bm25 over gRPC) and the query process' RSS across repeated runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np

from query_service.app import build_components
from query_service.retrieval_types import RetrievalQuery
from ragrpc.config import Settings
from ragrpc.embeddings import SentenceTransformerEmbedder
from ragrpc.models import chunk_id_for
from ragrpc.store.factory import open_milvus_stores
from ragrpc.store.request_filter import filter_from_request
from ragrpc.v1 import retrieve_pb2, retrieve_pb2_grpc
from scripts.bench import querydata as qd
from scripts.bench.common import BenchConfig, SectionResult, load_scifact, proc_status_kb, ratio, summary_ms
from scripts.processes import Stack

MODES = {
    "dense": retrieve_pb2.RETRIEVAL_MODE_DENSE,
    "sparse": retrieve_pb2.RETRIEVAL_MODE_SPARSE,
    "hybrid": retrieve_pb2.RETRIEVAL_MODE_HYBRID,
}
TOP_K, CANDIDATES = 10, 100


def bench_queries(n: int) -> list[str]:
    dataset = load_scifact()
    return [dataset.queries[q] for q in sorted(dataset.judged_queries())][:n]


def grpc_retrieve(stub: Any, text: str, mode: str) -> tuple[float, float, dict[str, float]]:
    """(total seconds, seconds to the first streamed chunk, the service's own stage
    timings in seconds from the summary) of one Retrieve."""
    options = retrieve_pb2.RetrievalOptions(
        top_k=TOP_K, candidates=CANDIDATES, mode=MODES[mode], collection=qd.COLLECTION
    )
    started, first, stages = time.perf_counter(), None, {}
    for response in stub.Retrieve(retrieve_pb2.RetrieveRequest(query=text, options=options), timeout=120):
        if first is None and response.HasField("chunk"):
            first = time.perf_counter() - started
        if response.HasField("summary"):
            stages = {t.stage: t.millis / 1000.0 for t in response.summary.timings}
    total = time.perf_counter() - started
    return total, first if first is not None else total, stages


def grpc_ask(stub: Any, text: str) -> tuple[float, float]:
    """(seconds to the first answer token, total seconds) of one Ask (extractive answerer)."""
    options = retrieve_pb2.RetrievalOptions(top_k=5, candidates=CANDIDATES, collection=qd.COLLECTION)
    started, first = time.perf_counter(), None
    for event in stub.Ask(retrieve_pb2.AskRequest(query=text, options=options), timeout=120):
        if first is None and event.HasField("token"):
            first = time.perf_counter() - started
    total = time.perf_counter() - started
    return (first if first is not None else total), total


def stop_process(stack: Stack, name: str) -> None:
    process = stack.processes.pop(name, None)
    if process is not None and process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


def exact_top(matrix: np.ndarray, vector: np.ndarray, k: int) -> np.ndarray:
    scores = matrix @ vector
    top = np.argpartition(-scores, k - 1)[:k]
    return top[np.argsort(-scores[top])]


def measure_layers(
    stub: Any,
    settings: Settings,
    embedder: SentenceTransformerEmbedder,
    matrix: np.ndarray,
    queries: list[str],
) -> dict[str, list[float]]:
    """Seconds per query for every layer, interleaved query by query."""
    stores = open_milvus_stores(settings, model_id=embedder.model_id, dimension=embedder.dimension, writer=False)
    # the same sparse backend as the service these layers are compared with (started with milvus_bm25)
    settings = dataclasses.replace(settings, sparse_backend="milvus_bm25")
    components = build_components(settings, embedder, stores.chunks, stores.registry)
    expr = filter_from_request(qd.TENANT, qd.COLLECTION)
    loop = asyncio.new_event_loop()
    samples: dict[str, list[float]] = {}

    def timed(name: str, fn: Callable[..., Any], *args: Any) -> Any:
        started = time.perf_counter()
        value = fn(*args)
        samples.setdefault(name, []).append(time.perf_counter() - started)
        return value

    def run_sync(coroutine: Any) -> Any:
        return loop.run_until_complete(coroutine)

    try:
        for number, text in enumerate([*queries[:3], *queries]):
            vector = timed("embed query", embedder.embed_query, text)
            timed("store search_dense", stores.chunks.search_dense, vector, expr, CANDIDATES)
            timed("store search_bm25", stores.chunks.search_bm25, text, expr, CANDIDATES)
            timed("numpy exact dense", exact_top, matrix, vector, CANDIDATES)
            for mode in MODES:
                query = RetrievalQuery(
                    text=text,
                    tenant=qd.TENANT,
                    top_k=TOP_K,
                    mode=mode,
                    candidates=CANDIDATES,
                    collection=qd.COLLECTION,
                )
                timed(f"in-process pipeline {mode}", run_sync, components.retrieval.retrieve(query))
                total, first, stages = grpc_retrieve(stub, text, mode)
                samples.setdefault(f"gRPC Retrieve {mode}", []).append(total)
                samples.setdefault(f"gRPC Retrieve {mode} first chunk", []).append(first)
                if "total" in stages:  # what the service itself measured around its pipeline
                    samples.setdefault(f"service pipeline {mode}", []).append(stages["total"])
                    samples.setdefault(f"gRPC overhead {mode}", []).append(total - stages["total"])
                for stage in ("embed_query", "dense_search", "sparse_search", "visibility"):
                    if mode == "hybrid" and stage in stages:
                        samples.setdefault(f"service stage {stage}", []).append(stages[stage])
            ttft, total = grpc_ask(stub, text)
            samples.setdefault("gRPC Ask first token", []).append(ttft)
            samples.setdefault("gRPC Ask total", []).append(total)
            if number == 2:  # three warm-up queries: drop them
                samples.clear()
    finally:
        loop.close()
        components.executor.shutdown(wait=False, cancel_futures=True)
        stores.connection.reset()
    return samples


def measure_index(
    settings: Settings,
    embedder: SentenceTransformerEmbedder,
    matrix: np.ndarray,
    ids: list[str],
    query_vectors: list[np.ndarray],
) -> dict[str, float]:
    """p50 of search_dense and mean recall@10 against exact over the same vectors."""
    stores = open_milvus_stores(settings, model_id=embedder.model_id, dimension=embedder.dimension, writer=False)
    expr = filter_from_request(qd.TENANT, qd.COLLECTION)
    started = time.perf_counter()
    stores.chunks.search_dense(query_vectors[0], expr, TOP_K)
    first = time.perf_counter() - started
    latencies, recalls = [], []
    for vector in query_vectors:
        started = time.perf_counter()
        hits = stores.chunks.search_dense(vector, expr, TOP_K)
        latencies.append(time.perf_counter() - started)
        exact = {ids[i] for i in exact_top(matrix, vector, TOP_K)}
        recalls.append(len(exact.intersection(h.chunk.chunk_id for h in hits[:TOP_K])) / TOP_K)
    stores.connection.reset()
    return {
        "p50_ms": summary_ms(latencies)["p50"],
        "recall@10": float(np.mean(recalls)),
        "first_search_s": first,
    }


def memory_rounds(stub: Any, pid: int, queries: list[str], rounds: int) -> list[int]:
    """VmRSS (kB) of the query process before and after each round of hybrid Retrieve + Ask."""
    readings = [proc_status_kb(pid).get("VmRSS", 0)]
    for _ in range(rounds):
        for text in queries:
            grpc_retrieve(stub, text, "hybrid")
            grpc_ask(stub, text)
        readings.append(proc_status_kb(pid).get("VmRSS", 0))
    return readings


def run_size(
    stack: Stack,
    config: BenchConfig,
    result: SectionResult,
    size: int,
    vector_backend: str,
    embedder: SentenceTransformerEmbedder,
    queries: list[str],
) -> None:
    texts, matrix, made_by = qd.cached_texts_and_vectors(config, size, vector_backend)
    ids = [
        chunk_id_for(qd.TENANT, f"bench-{i // qd.CHUNKS_PER_DOCUMENT:06d}", qd.GENERATION, i % qd.CHUNKS_PER_DOCUMENT)
        for i in range(size)
    ]
    base = dataclasses.replace(Settings.from_env(), milvus_uri=stack.milvus_uri)
    hnsw = dataclasses.replace(base, collection_prefix=qd.prefix_for(size, "HNSW"), index_type="HNSW")
    print(f"  {size}: loading the HNSW collection", file=sys.stderr, flush=True)
    data: dict[str, Any] = {"vectors_backend": made_by, "mean_chars": float(np.mean([len(t) for t in texts]))}
    data["load_hnsw"] = qd.ensure_collection(hnsw, embedder.model_id, texts, matrix)
    env = {"RAGRPC_COLLECTION_PREFIX": hnsw.collection_prefix, "RAGRPC_INDEX_TYPE": "HNSW"}
    address = stack.start_query(f"query-{size}", {**env, "RAGRPC_SPARSE_BACKEND": "milvus_bm25"})
    pid = stack.processes[f"query-{size}"].pid
    with grpc.insecure_channel(address) as channel:
        stub = retrieve_pb2_grpc.RetrieveServiceStub(channel)
        print(f"  {size}: layers over {len(queries)} queries", file=sys.stderr, flush=True)
        samples = measure_layers(stub, hnsw, embedder, matrix, queries)
        rounds = 2 if config.quick else 4
        data["query_rss_kb"] = memory_rounds(stub, pid, queries[: max(10, len(queries) // 3)], rounds)
    stop_process(stack, f"query-{size}")
    stats = {name: summary_ms(values) for name, values in samples.items()}
    data["latency_ms"] = stats
    address = stack.start_query(f"query-{size}-rank", {**env, "RAGRPC_SPARSE_BACKEND": "rank_bm25"})
    with grpc.insecure_channel(address) as channel:
        stub = retrieve_pb2_grpc.RetrieveServiceStub(channel)
        for text in queries[:3]:
            grpc_retrieve(stub, text, "sparse")
        rank = [grpc_retrieve(stub, text, "sparse")[0] for text in queries]
    data["rank_bm25_rss_kb"] = proc_status_kb(stack.processes[f"query-{size}-rank"].pid)
    stop_process(stack, f"query-{size}-rank")
    data["rank_bm25_sparse_ms"] = summary_ms(rank)
    vectors = [embedder.embed_query(t) for t in queries]
    indexes = {"HNSW": measure_index(hnsw, embedder, matrix, ids, vectors)}
    for index in ("FLAT", "IVF_FLAT"):
        nlist = min(base.ivf_nlist, max(16, size // 39))  # faiss wants >= 39 training points per list
        settings = dataclasses.replace(
            base, collection_prefix=qd.prefix_for(size, index), index_type=index, ivf_nlist=nlist
        )
        print(f"  {size}: loading the {index} collection", file=sys.stderr, flush=True)
        load = qd.ensure_collection(settings, embedder.model_id, texts, matrix)
        indexes[index] = {
            **measure_index(settings, embedder, matrix, ids, vectors),
            **load,
            **({"nlist": nlist, "nprobe": base.ivf_nprobe} if index == "IVF_FLAT" else {}),
        }
        qd.drop_collection(settings, embedder.model_id, embedder.dimension)  # keeps milvus-lite's memory down
    data["indexes"] = indexes
    result.data[str(size)] = data
    add_figures(result, size, stats, data)


def add_figures(result: SectionResult, size: int, stats: dict[str, dict[str, float]], data: dict[str, Any]) -> None:
    tag = f"{size // 1000}k"

    def p50(name: str) -> float | None:
        return stats[name]["p50"] if name in stats else None

    for mode in MODES:
        grpc_p50 = p50(f"gRPC Retrieve {mode}")
        row = stats[f"gRPC Retrieve {mode}"]
        result.add(
            f"{tag} gRPC Retrieve {mode} p50", grpc_p50, "ms", note=f"p95 {row['p95']:.1f}, p99 {row['p99']:.1f}"
        )
        result.add(
            f"{tag} service pipeline {mode} p50",
            p50(f"service pipeline {mode}"),
            "ms",
            ratio=ratio(p50(f"gRPC overhead {mode}"), grpc_p50),
            versus="gRPC overhead share",
            note="server-reported total; overhead = client total - server total, per call (target <= 0.10)",
        )
        result.add(
            f"{tag} in-process pipeline {mode} p50",
            p50(f"in-process pipeline {mode}"),
            "ms",
            ratio=ratio(p50(f"in-process pipeline {mode}"), grpc_p50),
            versus="gRPC p50",
            note="build_components(...).retrieval in the bench process",
        )
    result.add(f"{tag} first chunk (hybrid) p50", p50("gRPC Retrieve hybrid first chunk"), "ms")
    ask = stats["gRPC Ask first token"]
    result.add(
        f"{tag} Ask first token p50",
        ask["p50"],
        "ms",
        note=f"p99 {ask['p99']:.1f}; total p50 {stats['gRPC Ask total']['p50']:.1f}",
    )
    embed, dense, bm25 = p50("embed query"), p50("store search_dense"), p50("store search_bm25")
    result.add(f"{tag} query embedding p50", embed, "ms", note="bench process")
    result.add(f"{tag} store search_dense p50", dense, "ms", note=f"top {CANDIDATES}")
    result.add(f"{tag} store search_bm25 p50", bm25, "ms", note=f"top {CANDIDATES}")
    exact = p50("numpy exact dense")
    result.add(f"{tag} numpy exact dense p50", exact, "ms", ratio=ratio(exact, dense), versus="search_dense")
    for stage in ("embed_query", "dense_search", "sparse_search", "visibility"):
        result.add(f"{tag} in-service {stage} p50", p50(f"service stage {stage}"), "ms", note="hybrid calls")
    if embed is not None and dense is not None and bm25 is not None:
        result.add(f"{tag} Retrieve dense / (embed + dense)", ratio(p50("gRPC Retrieve dense"), embed + dense), "x")
        result.add(
            f"{tag} Retrieve hybrid / (embed + dense + bm25)",
            ratio(p50("gRPC Retrieve hybrid"), embed + dense + bm25),
            "x",
            note="target <= 2",
        )
    rank = data["rank_bm25_sparse_ms"]["p50"]
    result.add(
        f"{tag} gRPC sparse rank_bm25 p50",
        rank,
        "ms",
        ratio=ratio(rank, p50("gRPC Retrieve sparse")),
        versus="milvus_bm25 gRPC sparse",
    )
    for index, row in data["indexes"].items():
        result.add(
            f"{tag} {index} search_dense top-10 p50",
            row["p50_ms"],
            "ms",
            note=f"recall@10 {row['recall@10']:.3f} vs exact",
        )
    rss = data["query_rss_kb"]
    growth = (rss[-1] - rss[1]) / 1024 if len(rss) > 2 else (rss[-1] - rss[0]) / 1024
    result.add(
        f"{tag} query RSS growth after round 1",
        growth,
        "MiB",
        note="RSS MiB before/after rounds: " + " ".join(f"{r / 1024:.0f}" for r in rss),
    )


def run(config: BenchConfig, vector_backend: str = "onnx-int8") -> SectionResult:
    result = SectionResult("query")
    settings = Settings.from_env()
    embedder = SentenceTransformerEmbedder(
        settings.embedding_model,
        backend=settings.embedding_backend,
        batch_size=settings.embedding_batch_size,
        onnx_cache_dir=config.onnx_cache,
    )
    embedder.warm_up()
    queries = bench_queries(config.latency_queries)
    with Stack(config.bench_dir / "query-stack") as stack:
        stack.start_milvus()
        for size in config.query_sizes:
            run_size(stack, config, result, size, vector_backend, embedder, queries)
        result.data["milvus_rss_kb"] = proc_status_kb(stack.processes["milvus"].pid)
    result.notes.append(
        f"{len(queries)} SciFact train claims per layer, sequential, one client; top_k {TOP_K}, "
        f"candidates {CANDIDATES}; query embedding backend {settings.embedding_backend} "
        "(the service default) in both the service and this process"
    )
    result.notes.append(
        "gRPC overhead share = median(client total - service-reported pipeline total) / gRPC p50, per call; "
        "target <= 0.10. The in-process pipeline runs in the bench process (another process, other scheduling)"
    )
    return result
