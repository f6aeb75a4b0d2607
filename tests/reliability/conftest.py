"""Shared machinery of the reliability tests: judging gRPC errors, running the real services
as OS processes (kill -9, restart on the same port, RSS), and checking the store invariants
directly in Milvus.

The long versions are marked `reliability` (skipped unless --run-reliability); the short
versions are unmarked or `slow` and prove the same properties on a smaller scale. Every test
prints what it measured (run pytest with -s to see the figures).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc, retrieve_pb2, retrieve_pb2_grpc
from tests.support.milvus_server import MilvusLiteServer
from tests.support.rpc_details import rpc_details

REPO = Path(__file__).resolve().parents[2]
TENANT = "default"
_HERE = Path(__file__).resolve().parent


# A refused request or document must carry one of these codes (and a message).
REFUSAL_CODES = frozenset(
    {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.FAILED_PRECONDITION}
)
REFUSAL_CODE_NAMES = frozenset(code.name for code in REFUSAL_CODES)


# --- judging errors -----------------------------------------------------------------------


def refusal_problem(error: grpc.RpcError, allowed: frozenset[grpc.StatusCode] = REFUSAL_CODES) -> str | None:
    """None when `error` is a clean refusal (an allowed code, a message, an ErrorInfo reason);
    otherwise what is wrong with it."""
    code = error.code()  # type: ignore[attr-defined]
    message = error.details() or ""  # type: ignore[attr-defined]
    if code not in allowed:
        return f"{code.name}: {message[:300]}"
    if not message.strip():
        return f"{code.name} without a message"
    info = rpc_details(error).get("ErrorInfo")
    if info is None or not info.reason:
        return f"{code.name} without google.rpc.ErrorInfo ({message[:120]})"
    return None


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, int(round(fraction * (len(ordered) - 1)))))
    return ordered[index]


def latency_summary(values_s: list[float]) -> str:
    if not values_s:
        return "no samples"
    ms = [v * 1000 for v in values_s]
    return (
        f"n={len(ms)} p50={percentile(ms, 0.5):.0f}ms p90={percentile(ms, 0.9):.0f}ms "
        f"p99={percentile(ms, 0.99):.0f}ms max={max(ms):.0f}ms mean={statistics.fmean(ms):.0f}ms"
    )


def print_table(title: str, rows: list[tuple[Any, ...]], header: tuple[str, ...]) -> None:
    print(f"\n=== {title} ===")
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    widths = [min(w, 70) for w in widths]
    print("  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=False)))
    for row in rows:
        print("  ".join(str(x)[:70].ljust(w) for x, w in zip(row, widths, strict=False)))


# --- real processes ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_kib(pid: int) -> int:
    """Resident set size of a process (KiB), 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


def health(address: str, timeout_s: float = 3.0) -> str:
    """The overall health status name of a service ("SERVING", ...), or the gRPC code name."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError as exc:
            return exc.code().name  # type: ignore[attr-defined]
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def service_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGRPC_")}
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "RAGRPC_HOST": "127.0.0.1",
            "RAGRPC_WORKERS": "2",
            "RAGRPC_SHUTDOWN_GRACE_S": "2",
            "RAGRPC_INGEST_METRICS_PORT": "-1",
            "RAGRPC_QUERY_METRICS_PORT": "-1",
            "PYTHONPATH": str(REPO),
        }
    )
    env.update(extra)
    return env


class ServiceProcess:
    """One `python -m <module>` service with its own log file, in its own process group."""

    def __init__(self, name: str, module: str, port: int, env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.module = module
        self.port = port
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.start_seconds: list[float] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def spawn(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        log.write(f"\n----- start {self.starts + 1} at {time.strftime('%H:%M:%S')} -----\n".encode())
        log.flush()
        self.process = subprocess.Popen(
            [sys.executable, "-m", self.module],
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.starts += 1

    def start(self, timeout_s: float = 300.0) -> float:
        """Spawns the service and waits until it answers SERVING; returns the seconds it took."""
        started = time.monotonic()
        self.spawn()
        self.wait_serving(timeout_s)
        elapsed = time.monotonic() - started
        self.start_seconds.append(elapsed)
        return elapsed

    def wait_serving(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode if self.process else '?'}:\n{self.log_tail()}"
                )
            if health(self.address, 1.0) == "SERVING":
                return
            time.sleep(0.25)
        raise RuntimeError(f"{self.name} not SERVING after {timeout_s:.0f}s:\n{self.log_tail()}")

    def kill(self, sig: int = signal.SIGKILL, wait_s: float = 30.0) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait(timeout=10)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


@dataclass
class RealStack:
    """A milvus-lite server + the ingest service + the query service as OS processes, each
    on a port fixed for the stack's life (restarts come back on the same port and data)."""

    root: Path
    prefix: str = "rel"
    env: dict[str, str] = field(default_factory=dict)
    milvus: MilvusLiteServer | None = None
    ingest: ServiceProcess | None = None
    query: ServiceProcess | None = None

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "milvus").mkdir(exist_ok=True)
        self.milvus = MilvusLiteServer(self.root / "milvus", free_port())
        base = {"RAGRPC_COLLECTION_PREFIX": self.prefix, "RAGRPC_MILVUS_URI": self.milvus.uri, **self.env}
        self.ingest = ServiceProcess(
            "ingest", "ingest_service", free_port(), service_env({**base, "RAGRPC_INGEST_PORT": "0"}), self.root
        )
        self.ingest.env["RAGRPC_INGEST_PORT"] = str(self.ingest.port)
        self.query = ServiceProcess(
            "query", "query_service", free_port(), service_env({**base, "RAGRPC_QUERY_PORT": "0"}), self.root
        )
        self.query.env["RAGRPC_QUERY_PORT"] = str(self.query.port)

    @property
    def milvus_uri(self) -> str:
        assert self.milvus is not None
        return self.milvus.uri

    def start(self, *, query: bool = True) -> RealStack:
        assert self.milvus and self.ingest and self.query
        self.milvus.start()
        self.ingest.start()
        if query:
            self.query.start()
        return self

    def stop(self) -> None:
        for service in (self.query, self.ingest):
            if service is not None:
                service.kill(signal.SIGTERM, wait_s=20)
        if self.milvus is not None:
            self.milvus.stop()

    def reader_stores(self) -> Any:
        return open_reader_stores(self.milvus_uri, self.prefix)


def open_reader_stores(uri: str, prefix: str) -> Any:
    """`open_milvus_stores(..., writer=False)` with the model recorded on the collection."""
    from ragrpc.config import Settings
    from ragrpc.store import schema as s
    from ragrpc.store.factory import open_milvus_stores
    from ragrpc.store.milvus_connection import MilvusConnection

    connection = MilvusConnection(uri, timeout_s=30.0)
    connection.wait_until_ready(60.0)
    rows = connection.call(lambda c: c.get(f"{prefix}_documents", ids=[s.MODEL_INFO_KEY], output_fields=[s.RECORD]))
    connection.reset()
    info = rows[0][s.RECORD]
    settings = dataclasses.replace(Settings(), milvus_uri=uri, collection_prefix=prefix)
    return open_milvus_stores(
        settings, model_id=str(info["model_id"]), dimension=int(info["dimension"]), writer=False, wait_s=60.0
    )


# --- sync gRPC helpers for the process tests ------------------------------------------------------


def upload(
    address: str, spec: ingest_pb2.DocumentSpec, content: bytes, *, timeout_s: float = 120.0, piece: int = 1 << 20
) -> ingest_pb2.UploadDocumentResponse:
    def messages() -> Iterator[ingest_pb2.UploadDocumentRequest]:
        yield ingest_pb2.UploadDocumentRequest(header=spec)
        for start in range(0, len(content), piece):
            yield ingest_pb2.UploadDocumentRequest(data=content[start : start + piece])

    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
        return ingest_pb2_grpc.IngestServiceStub(channel).UploadDocument(messages(), timeout=timeout_s)


def retrieve(
    address: str, query: str, *, timeout_s: float = 60.0, **options: Any
) -> list[retrieve_pb2.RetrieveResponse]:
    with grpc.insecure_channel(address) as channel:
        stub = retrieve_pb2_grpc.RetrieveServiceStub(channel)
        request = retrieve_pb2.RetrieveRequest(query=query, options=retrieve_pb2.RetrievalOptions(**options))
        return list(stub.Retrieve(request, timeout=timeout_s))


def chunks_of(address: str, document_id: str, query: str = "the", timeout_s: float = 60.0) -> list[Any]:
    """Chunks the query service returns for one document (dense retrieval, document_ids filter)."""
    responses = retrieve(
        address,
        query,
        timeout_s=timeout_s,
        top_k=100,
        candidates=1000,
        mode=retrieve_pb2.RETRIEVAL_MODE_DENSE,
        filter=retrieve_pb2.MetadataFilter(document_ids=[document_id]),
    )
    return [r.chunk for r in responses if r.HasField("chunk")]


FRESHNESS_S = 2.0  # acknowledged ingestion -> searchable in the query service (README, Freshness)


def chunks_once_followed(address: str, document_id: str, expected: int) -> list[Any]:
    """chunks_of after an acknowledged ingestion: asked again until `expected` chunks are
    retrievable or FRESHNESS_S has passed (the query service follows the registry in the
    background; its in-process indexes see a new document after their next poll)."""
    deadline = time.monotonic() + FRESHNESS_S
    while True:
        found = chunks_of(address, document_id)
        if len(found) >= expected or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@pytest.fixture(scope="session")
def shared_real_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealStack]:
    """One real stack (milvus-lite + ingest + query, real model) shared by the tests that do not
    kill anything; started on first use."""
    stack = RealStack(tmp_path_factory.mktemp("shared-stack"), prefix="shared")
    started = time.monotonic()
    try:
        stack.start()
        print(
            f"\n[shared real stack] started in {time.monotonic() - started:.1f}s "
            f"(milvus {stack.milvus_uri}, ingest {stack.ingest.address}, query {stack.query.address})"
        )
        yield stack
    finally:
        stack.stop()
