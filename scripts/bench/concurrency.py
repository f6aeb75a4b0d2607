"""Many callers at once: throughput (calls/s) and latency percentiles of the real query service under
1, 4, 16 and 64 concurrent callers of `Retrieve` (hybrid, top-10) and `Ask` (extractive, top-5), over
gRPC, on milvus-lite and on the Milvus 2.3.5 server, with the service as one process and as two
(RAGRPC_QUERY_PROCESSES=2, one per core).

The collection is the scale section's (scripts/bench/scale.py: one-chunk documents of real text,
bulk-loaded, reused from .bench/scale/<store>-<size>/), 100,000 chunks by default. The service is
`python -m query_service` with its default settings plus an index snapshot directory (the one-process
run writes the snapshot; the two-process run's workers load it). Each caller is its own channel with
its own connection (SO_REUSEPORT spreads connections over the worker processes, not calls) and calls
back to back for a fixed time; a call's latency is first byte out to status in, for calls that
finished OK. The load generator is this process (grpc.aio, one event loop): its CPU time per level is
reported beside the service's and the store's, so a reader can see whether it starved the service.

Then the limit: the service with RAGRPC_MAX_CONCURRENT_RPCS low (8 per process) under 64 callers with
a 2 s deadline each: calls past the limit must come back RESOURCE_EXHAUSTED at once, and none may end
in DEADLINE_EXCEEDED (no queue piles up behind the limit).

Results: docs/benchmarks.md (one table per store, between the `concurrency` markers) and
docs/concurrency.png (scripts/bench/concurrency_report.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from ragrpc.config import Settings
from ragrpc.embeddings import embedder_from_settings
from ragrpc.v1 import retrieve_pb2, retrieve_pb2_grpc
from scripts.bench import scale
from scripts.bench.common import (
    BENCH_DIR,
    BenchConfig,
    SectionResult,
    load_scifact,
    proc_cpu_seconds,
    process_tree,
    summary_ms,
)
from scripts.processes import REPO, free_port, wait_serving

STORES = ("milvus-lite", "milvus-2.3.5")
PROCESSES = (1, 2)
LEVELS = (1, 4, 16, 64)
LIMIT_PER_PROCESS = 8
LIMIT_CALLERS = 64
LIMIT_DEADLINE_S = 2.0
CALL_DEADLINE_S = 120.0
ROOT = BENCH_DIR / "concurrency"


# --- the service under test ----------------------------------------------------------------------------


def tree_cpu_seconds(pid: int) -> float:
    return sum(cpu for p in process_tree(pid) if (cpu := proc_cpu_seconds(p)) == cpu)  # nan: gone meanwhile


@dataclasses.dataclass
class QueryService:
    """One `python -m query_service` (a supervisor and its workers when processes > 1) over a collection."""

    uri: str
    prefix: str
    processes: int
    snapshot_dir: Path
    log_dir: Path
    extra_env: dict[str, str] = dataclasses.field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    address: str = ""
    serving_s: float = 0.0
    log_offset: int = 0  # where this start's lines begin in the log

    def log_since_start(self) -> str:
        with open(self.log_path, "rb") as log:
            log.seek(self.log_offset)
            return log.read().decode(errors="replace")

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"query-{self.prefix}-p{self.processes}.log"

    def start(self, timeout_s: float = 3600.0) -> QueryService:
        port = free_port()
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("RAGRPC_")},
            "HF_HUB_OFFLINE": "1",
            "RAGRPC_MILVUS_URI": self.uri,
            "RAGRPC_COLLECTION_PREFIX": self.prefix,
            "RAGRPC_QUERY_PORT": str(port),
            "RAGRPC_QUERY_METRICS_PORT": "-1",
            "RAGRPC_QUERY_PROCESSES": str(self.processes),
            "RAGRPC_INDEX_SNAPSHOT_DIR": str(self.snapshot_dir),
            **self.extra_env,
        }
        self.log_dir.mkdir(parents=True, exist_ok=True)
        offset = self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        started = time.perf_counter()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "query_service"],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.address = f"127.0.0.1:{port}"
        wait_serving(self.address, self.process, timeout_s)
        if self.processes > 1:
            self._wait_for_log(f"all {self.processes} workers SERVING", offset, timeout_s)
        self.serving_s = time.perf_counter() - started
        return self

    def _wait_for_log(self, line: str, offset: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"the query service exited with {self.process.returncode}; see {self.log_path}")
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                if line.encode() in log.read():
                    return
            time.sleep(0.3)
        raise RuntimeError(f"{line!r} not logged within {timeout_s:.0f}s; see {self.log_path}")

    def cpu_seconds(self) -> float:
        assert self.process is not None
        return tree_cpu_seconds(self.process.pid)

    def pids(self) -> list[int]:
        assert self.process is not None
        return process_tree(self.process.pid)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


@contextmanager
def running(service: QueryService) -> Iterator[QueryService]:
    try:
        yield service.start()
    finally:
        service.stop()


# --- the load generator --------------------------------------------------------------------------------


def _request(kind: str, text: str) -> Any:
    if kind == "Retrieve":
        return retrieve_pb2.RetrieveRequest(
            query=text, options=retrieve_pb2.RetrievalOptions(top_k=10, mode=retrieve_pb2.RETRIEVAL_MODE_HYBRID)
        )
    return retrieve_pb2.AskRequest(query=text, options=retrieve_pb2.RetrievalOptions(top_k=5))


async def _call(stub: Any, kind: str, text: str, deadline_s: float) -> None:
    method = stub.Retrieve if kind == "Retrieve" else stub.Ask
    async for _ in method(_request(kind, text), timeout=deadline_s):
        pass


def connections_by_process(pids: list[int], port: int) -> dict[int, int]:
    """Established TCP connections to `port` that each of `pids` holds (from /proc: the sockets among
    each process's open files, matched by inode in /proc/net/tcp and tcp6). With SO_REUSEPORT the
    kernel hashes each new connection to one worker, so this is how the callers split over them."""
    established: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # ESTABLISHED, local port
                established.add(fields[9])
    counts = {}
    for pid in pids:
        inodes = set()
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
        except OSError:
            continue
        if held := len(inodes & established):
            counts[pid] = held
    return counts


async def load_level(
    address: str,
    kind: str,
    callers: int,
    seconds: float,
    queries: list[str],
    deadline_s: float = CALL_DEADLINE_S,
    on_connected: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """`callers` callers, each on its own channel (its own connection), call back to back for `seconds`;
    calls still running at the end are awaited and counted. Latencies of OK calls and of refused ones.
    `on_connected` runs once every channel is connected; what it returns is the row's `connected`."""
    ok: list[float] = []
    refused: list[float] = []
    codes: Counter[str] = Counter()
    channels = [
        grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(callers)
    ]
    try:
        stubs = [retrieve_pb2_grpc.RetrieveServiceStub(channel) for channel in channels]
        await asyncio.gather(*(channel.channel_ready() for channel in channels))  # each connected
        await _call(stubs[0], kind, queries[0], CALL_DEADLINE_S)  # and the service warm
        connected = on_connected() if on_connected is not None else None
        stop_at = time.perf_counter() + seconds

        async def caller(number: int, stub: Any) -> None:
            position = number * 7
            while time.perf_counter() < stop_at:
                text = queries[position % len(queries)]
                position += 1
                began = time.perf_counter()
                try:
                    await _call(stub, kind, text, deadline_s)
                except grpc.aio.AioRpcError as error:
                    codes[error.code().name] += 1
                    if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                        refused.append(time.perf_counter() - began)
                    continue
                codes["OK"] += 1
                ok.append(time.perf_counter() - began)

        cpu_before, began = time.process_time(), time.perf_counter()
        await asyncio.gather(*(caller(i, stub) for i, stub in enumerate(stubs)))
        elapsed = time.perf_counter() - began
        client_cpu = time.process_time() - cpu_before
    finally:
        await asyncio.gather(*(channel.close() for channel in channels))
    stats = summary_ms(ok)
    return {
        "callers": callers,
        "ok": len(ok),
        "codes": dict(codes),
        "seconds": elapsed,
        "per_s": len(ok) / elapsed,
        "p50": stats["p50"],
        "p99": stats["p99"],
        "refused_p50": summary_ms(refused)["p50"] if refused else None,
        "refused_p99": summary_ms(refused)["p99"] if refused else None,
        "client_cpu_s": client_cpu,
        "connected": connected,
    }


def measured_level(
    service: QueryService, store_pid: int | None, kind: str, callers: int, seconds: float, queries: list[str]
) -> dict[str, Any]:
    """load_level with the CPU seconds the service's processes and the store's used meanwhile."""
    service_before = service.cpu_seconds()
    store_before = tree_cpu_seconds(store_pid) if store_pid else float("nan")
    port = int(service.address.rsplit(":", 1)[1])
    row = asyncio.run(
        load_level(
            service.address,
            kind,
            callers,
            seconds,
            queries,
            on_connected=lambda: sorted(connections_by_process(service.pids(), port).values(), reverse=True),
        )
    )
    row["service_cpu_s"] = service.cpu_seconds() - service_before
    row["store_cpu_s"] = (tree_cpu_seconds(store_pid) - store_before) if store_pid else None
    return row


# --- the section ---------------------------------------------------------------------------------------


def _store_pid(backend: scale.Backend) -> int | None:
    server = backend.process()
    return server.pid if server is not None else None


def _describe(kind: str, processes: int, row: dict[str, Any]) -> str:
    codes = {k: v for k, v in row["codes"].items() if k != "OK"}
    seconds = row["seconds"]
    cpu = f"client {row['client_cpu_s'] / seconds:.0%} of a core, service {row['service_cpu_s'] / seconds:.0%}"
    split = row.get("connected")
    return (
        f"{kind} x{row['callers']} ({processes} proc): {row['per_s']:.1f}/s, p50 {row['p50']:.0f} ms, "
        f"p99 {row['p99']:.0f} ms, {cpu}{', connections per process ' + str(split) if split else ''}"
        f"{', errors ' + str(codes) if codes else ''}"
    )


def measure_store(
    kind: str, size: int, config: BenchConfig, queries: list[str], processes: tuple[int, ...], levels: tuple[int, ...]
) -> dict[str, Any]:
    settings = Settings()
    embedder = embedder_from_settings(settings, threads=settings.query_embedding_threads)
    embedder.warm_up()
    base = scale.base_vectors(embedder)
    backend = scale.Backend(kind, scale.SCALE_DIR / f"{kind}-{size}")
    uri = backend.start()
    seconds = 3.0 if config.quick else 12.0
    out: dict[str, Any] = {"store": kind, "size": size, "runs": [], "limit": None}
    try:
        prefix = f"scale{size}"
        store_settings = dataclasses.replace(settings, milvus_uri=uri, collection_prefix=prefix)
        out["collection"] = scale.ensure_bulk_collection(store_settings, embedder, size, base)
        snapshots = ROOT / f"snapshots-{kind}-{size}"
        for count in processes:
            service = QueryService(uri, prefix, count, snapshots, ROOT / "logs")
            with running(service):
                run: dict[str, Any] = {"processes": count, "serving_s": service.serving_s, "levels": {}}
                asyncio.run(load_level(service.address, "Retrieve", 4, seconds / 2, queries))  # warm, not counted
                for call in ("Retrieve", "Ask"):
                    rows = []
                    for callers in levels:
                        row = measured_level(service, _store_pid(backend), call, callers, seconds, queries)
                        print(f"[concurrency] {kind} {size:,}: {_describe(call, count, row)}", flush=True)
                        rows.append(row)
                    run["levels"][call] = rows
                out["runs"].append(run)
        limited = QueryService(
            uri,
            prefix,
            1,
            snapshots,
            ROOT / "logs",
            extra_env={"RAGRPC_MAX_CONCURRENT_RPCS": str(LIMIT_PER_PROCESS)},
        )
        with running(limited):
            row = asyncio.run(
                load_level(limited.address, "Retrieve", LIMIT_CALLERS, seconds, queries, deadline_s=LIMIT_DEADLINE_S)
            )
            print(f"[concurrency] {kind} {size:,} limit {LIMIT_PER_PROCESS}: {row['codes']}", flush=True)
            out["limit"] = {"limit": LIMIT_PER_PROCESS, "deadline_s": LIMIT_DEADLINE_S, **row}
    finally:
        backend.stop()
    return out


def run(config: BenchConfig, stores: tuple[str, ...] = (), size: int = 0) -> SectionResult:
    result = SectionResult("concurrency")
    chosen_size = size or (2_000 if config.quick else 100_000)
    levels = (1, 4) if config.quick else LEVELS
    queries = list(load_scifact().queries.values())[:200]
    measured = []
    for entry in stores or STORES:
        kind, _, size_given = entry.partition("@")  # "milvus-lite@10000": that store at another size
        entry_size = int(size_given) if size_given else chosen_size
        print(f"[concurrency] {kind} at {entry_size:,} chunks ...", flush=True)
        data = measure_store(kind, entry_size, config, queries, PROCESSES, levels)
        measured.append(data)
        for run_data in data["runs"]:
            for call, rows in run_data["levels"].items():
                for row in rows:
                    result.add(
                        f"{kind} {entry_size:,} {call} x{row['callers']}, {run_data['processes']} proc",
                        row["per_s"],
                        "calls/s",
                        note=f"p50 {row['p50']:.0f} ms, p99 {row['p99']:.0f} ms, client CPU "
                        f"{row['client_cpu_s'] / row['seconds']:.0%} of a core, codes {row['codes']}",
                    )
        limit = data["limit"]
        result.add(
            f"{kind} {entry_size:,} 64 callers, limit {limit['limit']}: refused (RESOURCE_EXHAUSTED) p99",
            limit["refused_p99"],
            "ms",
            note=f"codes {limit['codes']}",
        )
    result.data["stores"] = measured
    result.data["machine_cores"] = os.cpu_count()
    from scripts.bench.concurrency_report import write_report

    write_report(measured, Path("docs"))
    result.notes.append("table: docs/benchmarks.md; plot: docs/concurrency.png")
    return result
