"""The real query service process over a bench collection: start to SERVING and its resident
memory, as a user's `python -m query_service` would have them (the scale section's in-process
figures share the bench process with other arrays, so its RSS growth is noise).

The service starts with the default settings against the collection's URI and prefix; the probe
times spawn -> health SERVING, reads VmRSS / VmHWM from /proc, answers one hybrid Retrieve over
gRPC (the index is complete at SERVING) and stops the process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from ragrpc.v1 import retrieve_pb2, retrieve_pb2_grpc
from scripts.bench.common import proc_status_kb
from scripts.processes import REPO, free_port, wait_serving


def probe_query_service(
    uri: str, prefix: str, log_dir: Path, query: str, timeout_s: float = 3600.0, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """{"serving_s", "rss_mib", "peak_rss_mib", "first_retrieve_ms", "hits"} of a fresh query service."""
    port = free_port()
    environment = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "RAGRPC_MILVUS_URI": uri,
        "RAGRPC_COLLECTION_PREFIX": prefix,
        "RAGRPC_QUERY_PORT": str(port),
        "RAGRPC_QUERY_METRICS_PORT": "-1",
        **(env or {}),
    }
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log_dir / f"query-{prefix}.log", "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "query_service"],
            cwd=REPO,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        address = f"127.0.0.1:{port}"
        wait_serving(address, process, timeout_s)
        serving_s = time.perf_counter() - started
        memory = proc_status_kb(process.pid)
        with grpc.insecure_channel(address) as channel:
            began = time.perf_counter()
            responses = list(
                retrieve_pb2_grpc.RetrieveServiceStub(channel).Retrieve(
                    retrieve_pb2.RetrieveRequest(query=query), timeout=120
                )
            )
            first_ms = (time.perf_counter() - began) * 1000
        return {
            "serving_s": serving_s,
            "rss_mib": memory.get("VmRSS", 0) / 1024,
            "peak_rss_mib": memory.get("VmHWM", 0) / 1024,
            "first_retrieve_ms": first_ms,
            "hits": sum(1 for r in responses if r.HasField("chunk")),
        }
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
