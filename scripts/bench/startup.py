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
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ingest_service.app import build_components as build_ingest
from ingest_service.requests import DocumentSpecInput, IngestItem
from query_service.app import build_components as build_query
from query_service.retrieval_types import RetrievalQuery
from ragrpc.config import Settings
from ragrpc.embeddings import SentenceTransformerEmbedder, embedder_from_settings
from ragrpc.store.factory import open_milvus_stores
from scripts.bench import bulk
from scripts.bench.common import BENCH_DIR, BenchConfig, SectionResult, load_scifact, proc_status_kb
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


# --- start from an index snapshot (RAGRPC_INDEX_SNAPSHOT_DIR), the real service process ------------------

SNAPSHOT_QUERIES = 100


def process_memory_mib(pid: int) -> dict[str, float]:
    """VmRSS, VmHWM (peak), RssAnon (private), RssFile (file-backed: the mapped snapshot, shared by the
    processes that map it) and Pss (the process's fair share of shared pages) in MiB, from /proc."""
    out: dict[str, float] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) / 1024
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                out["Pss"] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return out


def _workers(service: Any) -> list[int]:
    """The service's serving processes: the one process, or the supervisor's workers (its children but
    multiprocessing's resource tracker)."""
    tree = service.pids()
    if service.processes == 1:
        return tree[:1]
    return [pid for pid in tree[1:] if b"resource_tracker" not in _cmdline(pid)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _retrieve_over_grpc(address: str, queries: list[str]) -> dict[str, Any]:
    """Hybrid Retrieve top-10, one call at a time: p50/p99 and the median of each stage the service reports."""
    import grpc

    from ragrpc.v1 import retrieve_pb2, retrieve_pb2_grpc

    seconds: list[float] = []
    stages: dict[str, list[float]] = {}
    with grpc.insecure_channel(address) as channel:
        stub = retrieve_pb2_grpc.RetrieveServiceStub(channel)
        options = retrieve_pb2.RetrievalOptions(top_k=10, mode=retrieve_pb2.RETRIEVAL_MODE_HYBRID)
        first = time.perf_counter()
        list(stub.Retrieve(retrieve_pb2.RetrieveRequest(query=queries[0], options=options), timeout=120))
        first_ms = (time.perf_counter() - first) * 1000
        for text in queries:
            began = time.perf_counter()
            for reply in stub.Retrieve(retrieve_pb2.RetrieveRequest(query=text, options=options), timeout=120):
                if reply.HasField("summary"):
                    for timing in reply.summary.timings:
                        stages.setdefault(timing.stage, []).append(timing.millis)
            seconds.append(time.perf_counter() - began)
    ms = [s * 1000 for s in seconds]
    return {
        "first_ms": first_ms,
        "p50": statistics.median(ms),
        "p99": sorted(ms)[min(len(ms) - 1, int(round(0.99 * (len(ms) - 1))))],
        "stages": {name: statistics.median(values) for name, values in stages.items()},
    }


def _dense_recall_over_grpc(address: str, queries: list[str], expected: list[list[str]]) -> float:
    """Mean recall@10 of dense Retrieve (top-10 over gRPC) against exact search over the same vectors."""
    import grpc

    from ragrpc.v1 import retrieve_pb2, retrieve_pb2_grpc

    recalls = []
    with grpc.insecure_channel(address) as channel:
        stub = retrieve_pb2_grpc.RetrieveServiceStub(channel)
        options = retrieve_pb2.RetrievalOptions(top_k=10, mode=retrieve_pb2.RETRIEVAL_MODE_DENSE)
        for text, exact in zip(queries, expected, strict=True):
            request = retrieve_pb2.RetrieveRequest(query=text, options=options)
            replies = stub.Retrieve(request, timeout=120)
            got = {reply.chunk.chunk.chunk_id for reply in replies if reply.HasField("chunk")}
            recalls.append(len(got & set(exact)) / len(exact))
    return statistics.mean(recalls)


async def _freshness_over_grpc(settings: Settings, embedder: Any, address: str) -> dict[str, float]:
    """Median of 5: an acknowledged IngestPipeline.ingest (this process as the ingest service) to its
    first BM25 hit in the query service (over gRPC), and an acknowledged delete to its disappearance."""
    import grpc

    from ragrpc.v1 import retrieve_pb2, retrieve_pb2_grpc

    stores = open_milvus_stores(settings, model_id=embedder.model_id, dimension=embedder.dimension, writer=True)
    ingest = build_ingest(settings, embedder, stores.chunks, stores.registry)
    added, deleted = [], []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = retrieve_pb2_grpc.RetrieveServiceStub(channel)

        async def hits(word: str) -> int:
            options = retrieve_pb2.RetrievalOptions(top_k=1, mode=retrieve_pb2.RETRIEVAL_MODE_SPARSE)
            request = retrieve_pb2.RetrieveRequest(query=word, options=options)
            return sum([1 async for reply in stub.Retrieve(request, timeout=30) if reply.HasField("chunk")])

        try:
            for i in range(5):
                word = f"snapshotprobe{i}x{int(time.time())}"
                spec = DocumentSpecInput(document_id=f"fresh-{i}-{word}", file_name="fresh.txt")
                await ingest.pipeline.ingest(IngestItem(bulk.TENANT, spec, f"A probe about {word}.".encode()))

                async def found(word: str = word) -> bool:
                    return await hits(word) > 0

                added.append(await _until(found))
                await ingest.documents.delete(bulk.TENANT, spec.document_id)

                async def gone(word: str = word) -> bool:
                    return await hits(word) == 0

                deleted.append(await _until(gone))
        finally:
            await ingest.lifecycle.close()
            ingest.shutdown()
            stores.connection.reset()
    return {"ingest_to_searchable_s": statistics.median(added), "delete_to_gone_s": statistics.median(deleted)}


def _snapshot_size_mib(directory: Path) -> float:
    current = directory / "CURRENT"
    if not current.exists():
        return 0.0
    snapshot = directory / current.read_text().strip()
    return sum(f.stat().st_size for f in snapshot.iterdir()) / 2**20


def _start(uri: str, prefix: str, processes: int, snapshots: Path, logs: Path) -> dict[str, Any]:
    """Starts the service, returns its start figures and the running service (stopped by the caller)."""
    from scripts.bench.concurrency import QueryService

    service = QueryService(uri, prefix, processes, snapshots, logs).start()
    memory = {str(pid): process_memory_mib(pid) for pid in _workers(service)}
    started: dict[str, Any] = {"service": service, "serving_s": service.serving_s, "memory": memory}
    build_peak = build_peak_mib(service.log_since_start())
    if build_peak is not None:
        started["build_peak_mib"] = build_peak
    return started


_BUILD_PEAK = re.compile(r"the index build process wrote the snapshot in [0-9.]+s \(its peak RSS ([0-9]+) MiB\)")


def build_peak_mib(log: str) -> float | None:
    """The peak RSS of the child process that ran a full load and wrote the snapshot (query_service.snapshot_builder),
    as the service logs it; None when the start ran no build process."""
    found = _BUILD_PEAK.search(log)
    return float(found.group(1)) if found else None


def measure_snapshot_starts(kind: str, size: int, queries: list[str]) -> dict[str, Any]:
    """First start (full load, writes the snapshot), second start (from it) with Retrieve and freshness,
    then two processes from it; and the floors beside Retrieve."""
    from scripts.bench import scale

    settings = Settings()
    embedder = embedder_from_settings(settings, threads=settings.query_embedding_threads)
    embedder.warm_up()
    base = scale.base_vectors(embedder)
    backend = scale.Backend(kind, scale.SCALE_DIR / f"{kind}-{size}")
    uri = backend.start()
    root = BENCH_DIR / "startup-snapshots" / f"{kind}-{size}"
    shutil.rmtree(root, ignore_errors=True)
    row: dict[str, Any] = {"backend": kind, "size": size}
    try:
        prefix = f"scale{size}"
        store_settings = dataclasses.replace(settings, milvus_uri=uri, collection_prefix=prefix, workers=2)
        row["collection"] = scale.ensure_bulk_collection(store_settings, embedder, size, base)
        vectors = np.stack([embedder.embed_query(q) for q in queries])
        store_s, _ = scale._store_floor(store_settings, embedder, vectors)
        matrix = np.concatenate(list(bulk.derived_vectors(base, size)))
        exact_s, exact_top = scale._exact(matrix, vectors)
        del matrix
        expected = [[bulk.chunk_id(int(number)) for number in top[:10]] for top in exact_top]
        row["store_dense_ms"], row["exact_numpy_ms"] = scale._p(store_s), scale._p(exact_s)
        snapshots, logs = root / "snapshots", root / "logs"
        for label, processes in (("full", 1), ("snapshot", 1), ("snapshot_2proc", 2)):
            print(f"[startup_snapshots] {kind} {size:,}: start ({label}) ...", flush=True)
            started = _start(uri, prefix, processes, snapshots, logs)
            service = started.pop("service")
            try:
                if label == "snapshot":
                    row["retrieve_hybrid"] = _retrieve_over_grpc(service.address, queries)
                    row["dense_recall_at_10"] = _dense_recall_over_grpc(service.address, queries, expected)
                    row["freshness"] = asyncio.run(_freshness_over_grpc(store_settings, embedder, service.address))
                row[label] = started
            finally:
                service.stop()
            if label == "full":
                row["snapshot_mib"] = _snapshot_size_mib(snapshots)
    finally:
        backend.stop()
    return row


def run_from_snapshots(
    config: BenchConfig, sizes: tuple[int, ...] = (), backends: tuple[str, ...] = ()
) -> SectionResult:
    """The real query service started over a collection of each size (default 1M chunks) on each store:
    in full (it writes its index snapshot), from the snapshot, and as two processes from it."""
    from scripts.bench.startup_report import write_report

    chosen = sizes or ((2_000,) if config.quick else (1_000_000,))
    kinds = backends or ("milvus-2.3.5", "milvus-lite")
    result = SectionResult("startup_snapshots")
    queries = list(load_scifact().queries.values())[:SNAPSHOT_QUERIES]
    rows = []
    for kind in kinds:
        for size in chosen:
            row = measure_snapshot_starts(kind, size, queries)
            rows.append(row)
            label = f"{kind} {size:,}"
            result.add(f"{label}: start to SERVING, full load", row["full"]["serving_s"], "s")
            result.add(f"{label}: start to SERVING, from the snapshot", row["snapshot"]["serving_s"], "s")
            result.add(f"{label}: Retrieve hybrid p50 over gRPC", row["retrieve_hybrid"]["p50"], "ms")
            result.add(f"{label}: ingest -> searchable", row["freshness"]["ingest_to_searchable_s"], "s")
    result.data["rows"] = rows
    write_report(rows, Path("docs"))
    result.notes.append("table: docs/benchmarks.md (startup_snapshots markers)")
    return result
