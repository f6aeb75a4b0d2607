"""Probes of the outage tests (tests/reliability/test_outages.py): one call's outcome (status code,
seconds, whether google.rpc.RetryInfo came with it), a wait until a call succeeds again, and a
steady Retrieve load from threads that records every outcome."""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc

from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc, retrieve_pb2, retrieve_pb2_grpc
from tests.support.rpc_details import rpc_details


def call_outcome(fn: Any) -> tuple[str, float, bool]:
    """(code name, seconds, RetryInfo present) of one call."""
    started = time.monotonic()
    try:
        fn()
        return "OK", time.monotonic() - started, False
    except grpc.RpcError as exc:
        seconds = time.monotonic() - started
        return exc.code().name, seconds, "RetryInfo" in rpc_details(exc)  # type: ignore[attr-defined]


def retrieve_once(address: str, timeout_s: float = 60.0) -> None:
    with grpc.insecure_channel(address) as channel:
        responses = list(
            retrieve_pb2_grpc.RetrieveServiceStub(channel).Retrieve(
                retrieve_pb2.RetrieveRequest(query="where do mallards live?"), timeout=timeout_s
            )
        )
    assert responses and responses[-1].HasField("summary")


def get_document(address: str, document_id: str) -> ingest_pb2.Document:
    with grpc.insecure_channel(address) as channel:
        return (
            ingest_pb2_grpc.IngestServiceStub(channel)
            .GetDocument(ingest_pb2.GetDocumentRequest(document_id=document_id), timeout=30)
            .document
        )


def wait_until_ok(fn: Any, timeout_s: float) -> float:
    started = time.monotonic()
    last = ""
    while time.monotonic() - started < timeout_s:
        code, _, _ = call_outcome(fn)
        if code == "OK":
            return time.monotonic() - started
        last = code
        time.sleep(0.5)
    raise AssertionError(f"not recovered after {timeout_s:.0f}s (last outcome {last})")


class QueryLoad:
    """Threads calling Retrieve in a loop, recording (time, code, seconds, RetryInfo)."""

    def __init__(self, address: str, threads: int = 3) -> None:
        self.address = address
        self.stop = threading.Event()
        self.results: list[tuple[float, str, float, bool]] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(threads)]

    def _loop(self) -> None:
        while not self.stop.is_set():
            code, seconds, retry = call_outcome(lambda: retrieve_once(self.address, 60.0))
            with self.lock:
                self.results.append((time.monotonic(), code, seconds, retry))
            time.sleep(0.05)

    def __enter__(self) -> QueryLoad:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(120)
