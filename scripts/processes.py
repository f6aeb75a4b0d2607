"""Starts the real processes (milvus-lite server, ingest service, query services) for the
evaluation and benchmark commands, each with its own log, and stops them together."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode}")
        with socket.socket() as sock:
            sock.settimeout(0.3)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"port {port} did not open in {timeout_s:.0f}s")


def wait_serving(address: str, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"service at {address} exited with {process.returncode}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.3)
    raise RuntimeError(f"{address} not SERVING after {timeout_s:.0f}s")


@dataclass
class Stack:
    """milvus-lite + one ingest service + any number of query services (name -> env overrides)."""

    data_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)
    milvus_uri: str = ""

    def _spawn(self, name: str, command: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.data_dir / f"{name}.log", "ab")  # noqa: SIM115
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.processes[name] = process
        return process

    def base_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "RAGRPC_MILVUS_URI": self.milvus_uri,
            "HF_HUB_OFFLINE": "1",
            "RAGRPC_INGEST_METRICS_PORT": "-1",
            "RAGRPC_QUERY_METRICS_PORT": "-1",
            **self.env,
        }

    def start_milvus(self) -> None:
        port = free_port()
        (self.data_dir / "milvus").mkdir(parents=True, exist_ok=True)
        process = self._spawn(
            "milvus",
            [
                str(Path(sys.executable).with_name("milvus-lite")),
                "server",
                "--data-dir",
                str(self.data_dir / "milvus"),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            dict(os.environ),
        )
        wait_port(port, process, 60)
        self.milvus_uri = f"http://127.0.0.1:{port}"

    def start_ingest(self, overrides: dict[str, str] | None = None) -> str:
        port = free_port()
        env = {**self.base_env(), "RAGRPC_INGEST_PORT": str(port), **(overrides or {})}
        process = self._spawn("ingest", [sys.executable, "-m", "ingest_service"], env)
        address = f"127.0.0.1:{port}"
        wait_serving(address, process, 300)
        self.addresses["ingest"] = address
        return address

    def start_query(self, name: str, overrides: dict[str, str] | None = None) -> str:
        port = free_port()
        env = {**self.base_env(), "RAGRPC_QUERY_PORT": str(port), **(overrides or {})}
        process = self._spawn(name, [sys.executable, "-m", "query_service"], env)
        address = f"127.0.0.1:{port}"
        wait_serving(address, process, 600)
        self.addresses[name] = address
        return address

    def stop(self) -> None:
        """Stops the processes one at a time, the last started first, each after the ones started
        after it have exited (as `make stop` does): a service's graceful shutdown (its last flush,
        its writer lease) still reaches the milvus-lite server it runs on."""
        for name in reversed(list(self.processes)):
            process = self.processes[name]
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.processes.clear()

    def __enter__(self) -> Stack:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # SIGTERM (e.g. `kill`, a CI timeout) must still stop the child processes.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
