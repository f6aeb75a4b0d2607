"""The ingest service's own ceiling: SciFact through gRPC with an embedder that costs nothing.

    python -m scripts.bench --sections ingest_ceiling [--ingest-docs N] [--ceiling-stores milvus-lite,milvus-2.3.5]

For each store (a `milvus-lite server`, and a Milvus 2.3.5 standalone server from PyPI's `milvus` package
when it is installed): the store server, an OpenAI-compatible embeddings server on 127.0.0.1 that answers
precomputed vectors (scripts/bench/precomputed_embeddings.py, a process of its own), and `python -m
ingest_service` with RAGRPC_EMBEDDING_PROVIDER=openai pointed at it, so the provider path is the real
one (HTTP, JSON, the openai client). The SciFact corpus goes in as `make eval` sends it (IngestDocuments
batches of 64 inline documents, each stream carrying each document's final event only) from 4 callers at
once, then again with every stage streamed (PROGRESS_DETAIL_STAGES); the rate is chunks written over the
time from the first request to the last summary. Beside it, in the same run, the store's own insert rate: the same
number of rows of the same shape (the chunks the service wrote, read back, with new ids), inserted by one
client in calls of 1,024 rows into a fresh collection, prebuilt so that only the client library's packing
and the store count. CPU seconds per chunk of every process (the ingest service with its worker
processes, the store server, the embeddings server, the bench's own gRPC client) say where the two cores
went.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from ragrpc.config import Settings
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.store.collections import CollectionNames
from ragrpc.store.factory import open_milvus_stores
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc
from scripts.bench.common import BenchConfig, SectionResult, load_scifact, proc_cpu_seconds, process_tree, ratio
from scripts.eval import _batches
from scripts.processes import REPO, Stack
from tests.support.milvus235 import Milvus235, milvus_server_executable

PREFIX = "bench_ceiling"
RAW_PREFIX = "bench_ceiling_raw"
COLLECTION = "scifact"
CALLERS = 4
DIMENSION = 384
MODEL = "precomputed-384"
RAW_CALL_ROWS = 1024
STORES = ("milvus-lite", "milvus-2.3.5")


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and of every live descendant (an ingest service's worker processes,
    `milvus-server`'s child), plus what its waited-for children used (/proc/PID/stat cutime, cstime)."""
    return sum(proc_cpu_seconds(p) + _waited_children_cpu(p) for p in process_tree(pid))


def _waited_children_cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


class EmbeddingsProcess:
    """scripts/bench/precomputed_embeddings.py as a child process."""

    def __init__(self, log: Path) -> None:
        self._log = log
        self.process: subprocess.Popen[str] | None = None
        self.url = ""

    def __enter__(self) -> EmbeddingsProcess:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "scripts.bench.precomputed_embeddings", "--dimension", str(DIMENSION)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=open(self._log, "ab"),  # noqa: SIM115
            text=True,
            start_new_session=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().split()
        if len(line) != 2 or line[0] != "READY":
            raise RuntimeError(f"the embeddings server did not start (see {self._log})")
        self.url = f"http://127.0.0.1:{line[1]}/v1"
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()


def send_corpus(address: str, requests: Iterator[ingest_pb2.IngestDocumentsRequest]) -> dict[str, Any]:
    """Sends every request, CALLERS at a time (each caller takes the next request when its stream ends)."""
    totals = {"chunks_written": 0, "failed": 0, "unchanged": 0, "documents": 0, "messages": 0}
    lock = threading.Lock()
    errors_seen: list[str] = []

    def caller(stub: ingest_pb2_grpc.IngestServiceStub) -> None:
        while True:
            with lock:
                request = next(requests, None)
            if request is None:
                return
            try:
                messages = 0
                for event in stub.IngestDocuments(request, timeout=3600):
                    messages += 1
                    if event.HasField("summary"):
                        with lock:
                            totals["chunks_written"] += event.summary.chunks_written
                            totals["failed"] += event.summary.failed
                            totals["unchanged"] += event.summary.unchanged
                            totals["documents"] += len(request.documents)
                with lock:
                    totals["messages"] += messages
            except grpc.RpcError as exc:
                with lock:
                    errors_seen.append(f"{exc.code()}: {exc.details()}")

    with grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 << 20)]) as channel:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        threads = [threading.Thread(target=caller, args=(stub,)) for _ in range(CALLERS)]
        started, cpu = time.perf_counter(), time.process_time()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        totals["seconds"] = time.perf_counter() - started
        totals["client_cpu_s"] = time.process_time() - cpu
    if errors_seen:
        raise RuntimeError(f"{len(errors_seen)} IngestDocuments calls failed, the first: {errors_seen[0]}")
    return totals


def store_insert_rate(settings: Settings, rows_wanted: int, store_pid: int) -> dict[str, float]:
    """The store's own insert rate: the chunks the service wrote, read back with their vectors and
    analysed terms, as rows under new ids, inserted into a fresh collection by one client in calls of
    RAW_CALL_ROWS, packed column by column as the service sends them; timed from the first insert to
    the last reply (the rows are built first)."""
    source = open_milvus_stores(settings, model_id=MODEL, dimension=DIMENSION, provider="openai", writer=False)
    chunks = [c for page in source.chunks.scan_chunks(f.eq(s.COLLECTION, COLLECTION), with_vectors=True) for c in page]
    source.connection.reset()
    raw_settings = dataclasses.replace(settings, collection_prefix=RAW_PREFIX)
    target = open_milvus_stores(raw_settings, model_id=MODEL, dimension=DIMENSION, provider="openai", writer=True)
    try:
        for number, chunk in enumerate(chunks):
            chunk.chunk_id = f"raw-{number:08d}"
        rows = target.chunks.rows_for_insert(chunks[:rows_wanted])
        name = CollectionNames.with_prefix(RAW_PREFIX).chunks
        client = target.connection.client()
        store_cpu, cpu = tree_cpu_seconds(store_pid), time.process_time()
        started = time.perf_counter()
        for start in range(0, len(rows), RAW_CALL_ROWS):  # packed as the service packs them (column_writes)
            target.connection.column_writes.insert(client, name, rows[start : start + RAW_CALL_ROWS])
        seconds = time.perf_counter() - started
        client_cpu, store_cpu = time.process_time() - cpu, tree_cpu_seconds(store_pid) - store_cpu
    finally:
        target.connection.reset()
    count = len(rows) or 1
    return {
        "rows": float(len(rows)),
        "seconds": seconds,
        "rows_per_s": len(rows) / seconds if seconds else float("nan"),
        "store_cpu_ms_per_row": 1000 * store_cpu / count,
        "client_cpu_ms_per_row": 1000 * client_cpu / count,
    }


class StoreServer:
    """The store of one measurement: a milvus-lite server (in the Stack) or a Milvus 2.3.5 server."""

    def __init__(self, kind: str, root: Path, stack: Stack) -> None:
        self.kind = kind
        self._root = root
        self._stack = stack
        self._m235: Milvus235 | None = None

    def start(self) -> tuple[str, int]:
        if self.kind == "milvus-lite":
            self._stack.start_milvus()
            return self._stack.milvus_uri, self._stack.processes["milvus"].pid
        executable, reason = milvus_server_executable()
        if executable is None:
            raise RuntimeError(reason)
        self._m235 = Milvus235(executable, self._root)
        self._m235.start(timeout_s=600)
        assert self._m235.process is not None
        self._stack.milvus_uri = self._m235.uri
        return self._m235.uri, self._m235.process.pid

    def stop(self) -> None:
        if self._m235 is not None:
            self._m235.stop()


def measure(kind: str, config: BenchConfig, dataset: Any, progress_detail: int) -> dict[str, Any]:
    root = config.bench_dir / f"ingest-ceiling-{kind}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    with EmbeddingsProcess(root / "embeddings.log") as embeddings, Stack(root) as stack:
        store = StoreServer(kind, root, stack)
        try:
            uri, store_pid = store.start()
            env = {
                "RAGRPC_COLLECTION_PREFIX": PREFIX,
                "RAGRPC_EMBEDDING_PROVIDER": "openai",
                "RAGRPC_EMBEDDING_MODEL": MODEL,
                "RAGRPC_EMBEDDING_BASE_URL": embeddings.url,
                "RAGRPC_LOG_LEVEL": "WARNING",
                **{k: v for k, v in os.environ.items() if k.startswith("RAGRPC_") and k != "RAGRPC_MILVUS_URI"},
            }
            address = stack.start_ingest(env)
            assert embeddings.process is not None
            pids = {"ingest": stack.processes["ingest"].pid, "store": store_pid, "embeddings": embeddings.process.pid}
            before = {name: tree_cpu_seconds(pid) for name, pid in pids.items()}
            print(f"  {kind}: ingesting {len(dataset.corpus)} SciFact documents over gRPC", file=sys.stderr, flush=True)
            outcome = send_corpus(address, _batches(dataset, COLLECTION, progress_detail))
            cpu = {name: tree_cpu_seconds(pid) - before[name] for name, pid in pids.items()}
            settings = dataclasses.replace(Settings.from_env(), milvus_uri=uri, collection_prefix=PREFIX)
            raw = store_insert_rate(settings, outcome["chunks_written"], store_pid)
        finally:
            stack.stop()
            store.stop()
    chunks = outcome["chunks_written"] or 1
    cpu["client"] = outcome["client_cpu_s"]
    return {
        **outcome,
        "chunks_per_s": outcome["chunks_written"] / outcome["seconds"],
        "cpu_ms_per_chunk": {name: 1000 * seconds / chunks for name, seconds in cpu.items()},
        "store_alone": raw,
    }


TARGETS = {"milvus-lite": 800.0, "milvus-2.3.5": 1500.0}


def run(config: BenchConfig, stores: tuple[str, ...] = ()) -> SectionResult:
    result = SectionResult("ingest_ceiling")
    dataset = load_scifact(config.ingest_docs)
    for kind in stores or STORES:
        if kind not in STORES:
            raise ValueError(f"unknown store {kind!r}; use {', '.join(STORES)}")
        if kind == "milvus-2.3.5" and milvus_server_executable()[0] is None:
            result.notes.append(f"milvus-2.3.5 skipped: {milvus_server_executable()[1]}")
            continue
        # the corpus as `make eval` sends it (each document's final event), then with every stage streamed
        data = measure(kind, config, dataset, ingest_pb2.PROGRESS_DETAIL_FINAL)
        stages = measure(kind, config, dataset, ingest_pb2.PROGRESS_DETAIL_STAGES)
        result.data[kind] = data
        result.data[f"{kind} every stage"] = stages
        cpu = data["cpu_ms_per_chunk"]
        raw = data["store_alone"]
        for label, measured in (("final events", data), ("every stage", stages)):
            result.add(
                f"gRPC ingestion into {kind}, {label}",
                measured["chunks_per_s"],
                "chunks/s",
                ratio=ratio(measured["chunks_per_s"], measured["store_alone"]["rows_per_s"]),
                versus="the store's own insert rate",
                note=f"{measured['chunks_written']} chunks of {measured['documents']} docs in "
                f"{measured['seconds']:.1f} s, {measured['failed']} failed, "
                f"{measured['messages'] / max(measured['documents'], 1):.1f} stream messages a doc, "
                f"CPU a chunk: ingest service {measured['cpu_ms_per_chunk']['ingest']:.2f} ms; "
                f"target {TARGETS[kind]:,.0f}",
            )
        result.add(
            f"{kind} insert alone, calls of {RAW_CALL_ROWS} rows",
            raw["rows_per_s"],
            "rows/s",
            note=f"{raw['rows']:.0f} rows; CPU a row: store {raw['store_cpu_ms_per_row']:.3f} ms, "
            f"client {raw['client_cpu_ms_per_row']:.3f} ms",
        )
        result.add(
            f"CPU a chunk into {kind}, final events: ingest service (with its workers)",
            cpu["ingest"],
            "ms",
            note=f"store {cpu['store']:.2f}, embeddings server {cpu['embeddings']:.2f}, "
            f"bench client {cpu['client']:.2f} ms; all {sum(cpu.values()):.2f} ms on {os.cpu_count()} cores",
        )
    result.notes.append(
        f"embeddings: precomputed {DIMENSION}-d vectors from a local OpenAI-compatible HTTP server "
        f"(RAGRPC_EMBEDDING_PROVIDER=openai); {CALLERS} callers, IngestDocuments batches of 64 documents"
    )
    return result
