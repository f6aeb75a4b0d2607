"""`Retrieve` at collection size, on milvus-lite and on a real Milvus 2.3.5 server (issue: scale).

For each backend and size (default 10k and 100k one-chunk documents; `--scale-sizes` adds 1M) the
section bulk-loads a collection (scripts/bench/bulk.py: real texts, vectors derived from embedded
ones), waits for the dense index, builds the query service's components in this process (the
default settings: HNSW M 16 / ef 192, rank_bm25 over every chunk) and times, over real SciFact
claims embedded once:

  * the floors: the store's own dense search (top-100, tenant filter, ids only) and exact numpy
    search over the same matrix;
  * `Retrieve` top-10 (RetrievalPipeline.retrieve, query embedding included) in dense, sparse and
    hybrid (RRF) modes: p50 and p99;
  * dense recall@10 against exact search, of the store's own search and of `Retrieve` dense (which
    searches the store, or the vectors the query service holds: RAGRPC_DENSE_SEARCH, auto);
  * the real query service (`python -m query_service`, default settings) started fresh over the
    collection: start to SERVING and its resident memory (scripts/bench/service_probe.py).

Collections live under .bench/scale/<backend>-<size>/ and are reused while they hold what the
bench would write (a Milvus 2.3.5 server restarts on the ports recorded there, since its metadata
names them; when one is taken, the collection is built anew). Results go to docs/benchmarks.md
(table) and docs/scale.png (plot).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import gc
import json
import os
import shutil
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from query_service.app import build_components as build_query
from query_service.retrieval_types import RetrievalQuery
from ragrpc.config import Settings
from ragrpc.embeddings import SentenceTransformerEmbedder, embedder_from_settings
from ragrpc.server import freeze_startup_heap
from ragrpc.store.collections import CollectionNames
from ragrpc.store.factory import index_config, open_milvus_stores
from ragrpc.store.request_filter import filter_from_request
from scripts.bench import bulk
from scripts.bench.common import BENCH_DIR, BenchConfig, SectionResult, load_scifact, percentile, proc_status_kb
from scripts.bench.querydata import text_pool
from scripts.bench.service_probe import probe_query_service
from tests.support.milvus235 import Milvus235, milvus_server_executable, ports_free, stop_leftovers
from tests.support.milvus_server import MilvusLiteServer, free_port

BASE_TEXTS = 2048
QUERIES = 100
MODES = ("dense", "sparse", "hybrid")
SCALE_DIR = BENCH_DIR / "scale"


def _texts(size: int) -> list[str]:
    """`size` distinct texts: the pool's, then numbered variants of them when the pool is smaller."""
    pool = text_pool(None)
    if len(pool) >= size:
        return pool[:size]
    return [pool[i % len(pool)] + ("" if i < len(pool) else f" (variant {i // len(pool)})") for i in range(size)]


class Backend:
    """A store server for one collection directory: milvus-lite or Milvus 2.3.5."""

    def __init__(self, kind: str, root: Path) -> None:
        self.kind = kind
        self.root = root
        self._lite: MilvusLiteServer | None = None
        self._m235: Milvus235 | None = None
        self._claim: IO[str] | None = None

    def start(self) -> str:
        self._claim = claim_directory(self.root)
        try:
            return self._start()
        except BaseException:
            self._release()
            raise

    def _start(self) -> str:
        ports_file = self.root / "ports.json"
        ports = json.loads(ports_file.read_text()) if self.kind != "milvus-lite" and ports_file.exists() else None
        if ports and stop_leftovers(self.root):  # a server of this directory that an earlier run left behind
            print(f"[scale] stopped a Milvus server left running on {self.root}", flush=True)
        if self.kind != "milvus-lite" and not (ports and ports_free(ports)):
            # its metadata names its ports: reused only on the same ones (another program took one)
            print(f"[scale] the ports of {self.root} are taken: its collection is built again", flush=True)
            shutil.rmtree(self.root, ignore_errors=True)
            ports = None
        self.root.mkdir(parents=True, exist_ok=True)
        if self.kind == "milvus-lite":
            (self.root / "milvus").mkdir(exist_ok=True)
            self._lite = MilvusLiteServer(self.root / "milvus", free_port()).start(timeout_s=600)
            return self._lite.uri
        executable, reason = milvus_server_executable()
        if executable is None:
            raise RuntimeError(reason)
        self._m235 = Milvus235(executable, self.root, ports)
        ports_file.write_text(json.dumps(self._m235.ports))
        self._m235.start(timeout_s=600)
        return self._m235.uri

    def process(self) -> Any:
        """The server's process (subprocess.Popen), None before start; its children are the store's too."""
        if self._lite is not None:
            return self._lite.process
        return self._m235.process if self._m235 is not None else None

    def stop(self) -> None:
        try:
            if self._lite is not None:
                self._lite.stop()
            if self._m235 is not None:
                self._m235.stop()
        finally:
            self._release()

    def _release(self) -> None:
        if self._claim is not None:
            self._claim.close()  # closing the file lets go of its lock
            self._claim = None


def claim_directory(root: Path) -> IO[str]:
    """An exclusive claim on a store directory for as long as the returned file stays open (a lock on
    `<root>.lock` beside it, which outlives a rebuild of the directory), or RuntimeError naming the
    process that holds it. A second bench run on the same directory used to take it over: its start
    stops the server it finds there as one an earlier run left behind, while that run was still using
    it; two Milvus 2.3.5 servers on one directory lost every collection in it (2026-12-07)."""
    path = root.parent / f"{root.name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+")  # noqa: SIM115 - held open for as long as the claim lasts
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise RuntimeError(
            f"{root} is in use by another run (pid {holder}); wait for it to end or stop it, then run again"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def ensure_bulk_collection(
    settings: Settings, embedder: SentenceTransformerEmbedder, size: int, base: np.ndarray
) -> dict:
    stores = open_milvus_stores(settings, model_id=embedder.model_id, dimension=embedder.dimension, writer=True)
    names = CollectionNames.with_prefix(settings.collection_prefix)
    client = stores.connection.client()
    count = client.query(names.chunks, filter="", output_fields=["count(*)"])[0]["count(*)"]
    info: dict[str, Any] = {"reused": count == size}
    if count != size:
        if count:
            raise RuntimeError(f"{names.chunks} holds {count} rows, not {size}: remove {SCALE_DIR} and run again")
        texts = _texts(size)
        info["load_s"] = bulk.bulk_load(stores, settings.collection_prefix, texts, bulk.derived_vectors(base, size))
    started = time.perf_counter()
    _wait_for_index(client, names.chunks)
    info["index_wait_s"] = time.perf_counter() - started
    stores.connection.reset()
    return info


def _wait_for_index(client: Any, collection: str, timeout_s: float = 3600) -> None:
    """Until every index of the collection covers every row (Milvus builds them in the background)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        progress = [client.describe_index(collection, name) or {} for name in client.list_indexes(collection)]
        if all(_index_done(p) for p in progress):
            return
        time.sleep(2)
    raise TimeoutError(f"the index of {collection} did not finish building")


def _index_done(progress: dict[str, Any]) -> bool:
    total, indexed = progress.get("total_rows"), progress.get("indexed_rows")
    if progress.get("pending_index_rows"):
        return False
    if total is not None and indexed is not None and int(indexed) < int(total):
        return False
    return progress.get("state", "Finished") == "Finished"


def _matrix(base: np.ndarray, size: int) -> np.ndarray:
    return np.concatenate(list(bulk.derived_vectors(base, size)))


def _timed(fn: Any, items: list[Any]) -> tuple[list[float], list[Any]]:
    seconds, results = [], []
    for item in items:
        started = time.perf_counter()
        results.append(fn(item))
        seconds.append(time.perf_counter() - started)
    return seconds, results


def _store_floor(settings: Settings, embedder: SentenceTransformerEmbedder, vectors: np.ndarray) -> tuple:
    stores = open_milvus_stores(settings, model_id=embedder.model_id, dimension=embedder.dimension, writer=False)
    names = CollectionNames.with_prefix(settings.collection_prefix)
    client = stores.connection.client()
    params = index_config(settings).search_params(100)  # the adapter's own search parameters
    expr = filter_from_request(bulk.TENANT).render()

    def search(vector: np.ndarray) -> list[str]:
        hits = client.search(
            names.chunks,
            data=[vector.tolist()],
            anns_field="dense",
            filter=expr,
            limit=100,
            search_params=params,
            output_fields=["chunk_id"],
        )
        return [h["chunk_id"] for h in hits[0]]

    search(vectors[0])
    seconds, results = _timed(search, list(vectors))
    stores.connection.reset()
    return seconds, results


def _exact(matrix: np.ndarray, vectors: np.ndarray) -> tuple[list[float], list[np.ndarray]]:
    def top(vector: np.ndarray) -> np.ndarray:
        scores = matrix @ vector
        part = np.argpartition(-scores, 100)[:100]
        return part[np.argsort(-scores[part])]

    return _timed(top, list(vectors))


def _retrieve_times(query: Any, texts: list[str], mode: str) -> tuple[list[float], dict[str, float], list[list[str]]]:
    """Seconds of each Retrieve, the median milliseconds of each of its stages, and each one's hits."""

    async def run() -> tuple[list[float], dict[str, float], list[list[str]]]:
        seconds, stages, hits = [], defaultdict(list), []
        await query.retrieval.retrieve(RetrievalQuery(text=texts[0], tenant=bulk.TENANT, mode=mode))
        for text in texts:
            started = time.perf_counter()
            result = await query.retrieval.retrieve(RetrievalQuery(text=text, tenant=bulk.TENANT, mode=mode, top_k=10))
            seconds.append(time.perf_counter() - started)
            hits.append([h.chunk.chunk_id for h in result.hits])
            for stage, ms in result.timings:
                stages[stage].append(ms)
        return seconds, {stage: float(np.median(values)) for stage, values in stages.items()}, hits

    return asyncio.run(run())


def _recall(found: list[list[str]], exact_rows: list[np.ndarray]) -> float:
    return float(
        np.mean(
            [
                len(set(hits[:10]) & {bulk.chunk_id(int(r)) for r in exact[:10]}) / 10
                for hits, exact in zip(found, exact_rows, strict=True)
            ]
        )
    )


def _measure(kind: str, size: int, embedder: SentenceTransformerEmbedder, base: np.ndarray, queries: list[str]) -> dict:
    backend = Backend(kind, SCALE_DIR / f"{kind}-{size}")
    uri = backend.start()
    try:
        settings = dataclasses.replace(
            Settings(), milvus_uri=uri, collection_prefix=f"scale{size}", workers=2, sparse_backend="rank_bm25"
        )
        row: dict[str, Any] = {"backend": kind, "size": size, **ensure_bulk_collection(settings, embedder, size, base)}
        query_vectors = np.stack([embedder.embed_query(q) for q in queries])
        store_s, store_ids = _store_floor(settings, embedder, query_vectors)
        matrix = _matrix(base, size)
        exact_s, exact_rows = _exact(matrix, query_vectors)
        del matrix
        recall = _recall(store_ids, exact_rows)
        stores = open_milvus_stores(settings, model_id=embedder.model_id, dimension=embedder.dimension, writer=False)
        gc.collect()
        rss_before = proc_status_kb(os.getpid()).get("VmRSS", 0)
        started = time.perf_counter()
        query = build_query(settings, embedder, stores.chunks, stores.registry)
        row["serving_s"] = time.perf_counter() - started
        gc.collect()
        row["rss_per_chunk_bytes"] = (proc_status_kb(os.getpid()).get("VmRSS", 0) - rss_before) * 1024 / size
        row["store_dense_ms"] = _p(store_s)
        row["exact_numpy_ms"] = _p(exact_s)
        row["dense_recall_at_10"] = float(recall)
        row["dense_search"] = query.retrieval._dense.name  # RAGRPC_DENSE_SEARCH resolved (auto)
        with _heap_frozen_as_the_service_does():
            for mode in MODES:
                seconds, stages, hits = _retrieve_times(query, queries, mode)
                row[f"retrieve_{mode}_ms"] = _p(seconds)
                row[f"stages_{mode}_ms"] = stages
                if mode == "dense":  # the queries' embeddings are the floors' query vectors: the same exact top-10
                    row["retrieve_dense_recall_at_10"] = _recall(hits, exact_rows)
        query.executor.shutdown(wait=False)
        stores.connection.reset()
        del query
        gc.collect()
        print(f"[scale] {kind} at {size:,} chunks: a fresh query service process ...", flush=True)
        service = probe_query_service(uri, settings.collection_prefix, SCALE_DIR / "logs", queries[0])
        row.update({f"service_{key}": value for key, value in service.items()})
        return row
    finally:
        backend.stop()


@contextlib.contextmanager
def _heap_frozen_as_the_service_does() -> Iterator[None]:
    """The query service's main freezes its heap once the index is loaded (ragrpc.server.freeze_startup_heap),
    so `Retrieve` is timed in that state here too; afterwards the bench process's heap is unfrozen (the next
    size's components replace these) and the collector's thresholds restored."""
    threshold = gc.get_threshold()
    freeze_startup_heap()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def _p(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {"p50": percentile(ms, 50), "p99": percentile(ms, 99)}


def run(
    config: BenchConfig, sizes: tuple[int, ...] = (), backends: tuple[str, ...] = (), lite_max_size: int = 0
) -> SectionResult:
    """`lite_max_size` (>0): milvus-lite only up to that size (its 1M-chunk build and load take hours here)."""
    chosen = sizes or ((2_000,) if config.quick else (10_000, 100_000))
    kinds = backends or ("milvus-lite", "milvus-2.3.5")
    result = SectionResult("scale")
    settings = Settings()  # the query service's default backend (onnx-int8) and query threads
    embedder = embedder_from_settings(settings, threads=settings.query_embedding_threads)
    embedder.warm_up()
    base = base_vectors(embedder)
    queries = list(load_scifact().queries.values())[:QUERIES]
    rows = []
    for kind in kinds:
        for size in chosen:
            if kind == "milvus-lite" and 0 < lite_max_size < size:
                result.notes.append(f"milvus-lite at {size:,} chunks not run (--scale-lite-max-size {lite_max_size})")
                continue
            print(f"[scale] {kind} at {size:,} chunks ...", flush=True)
            row = _measure(kind, size, embedder, base, queries)
            rows.append(row)
            label = f"{kind} {size:,}"
            hybrid = row["retrieve_hybrid_ms"]
            result.add(f"{label}: Retrieve hybrid p50 / p99", hybrid["p50"], "ms", note=f"p99 {hybrid['p99']:.0f} ms")
            result.add(f"{label}: store dense top-100 p50 (floor)", row["store_dense_ms"]["p50"], "ms")
            result.add(f"{label}: dense recall@10 vs exact", row["dense_recall_at_10"], "")
    result.data["rows"] = rows
    from scripts.bench.scale_report import write_report

    write_report(rows, Path("docs"))
    result.notes.append("table: docs/benchmarks.md; plot: docs/scale.png")
    return result


def base_vectors(embedder: SentenceTransformerEmbedder) -> np.ndarray:
    """The embedded texts the collection's vectors derive from (cached: embedding them takes a minute)."""
    cache = SCALE_DIR / f"base-{BASE_TEXTS}-{embedder.model_id.replace('/', '_')}.npy"
    if cache.exists():
        return np.load(cache)
    vectors = embedder.embed_documents(text_pool(BASE_TEXTS))
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.save(cache, vectors)
    return vectors


if __name__ == "__main__":
    print(json.dumps(run(BenchConfig()).data, indent=1))
