"""A query service's first start with an index snapshot directory: the full load runs in a child process
(query_service.snapshot_builder), which writes the snapshot and exits; the service starts from it.

Real processes (marked slow): a milvus-lite server, the ingest service and `python -m query_service`, with
embeddings from a small OpenAI-compatible server so that no model loads. Covered: a first start builds in a
child and the service loads what it wrote (a document ingested during the build is found); a build process
killed mid-way costs the full load in the service itself; a service killed with SIGKILL leaves no build
process behind; SIGTERM during the build stops the build and the service.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from ragrpc.v1 import ingest_pb2, retrieve_pb2, retrieve_pb2_grpc
from tests.reliability.conftest import ServiceProcess, free_port, service_env, upload
from tests.support.embeddings_server import EmbeddingsServer
from tests.support.milvus_server import MilvusLiteServer

BUILD_STARTED = re.compile(r"full load in a child process \(pid (\d+)\)")
# the service's own full load (the child's lines say "query/index-build")
SERVICE_FULL_LOAD = re.compile(r" query \[[^\]]*\] query_service\.index_sync: .* loaded: \d+ chunks of \d+ documents")

pytestmark = pytest.mark.slow


class BuildStack:
    """milvus-lite and the ingest service with three documents; each test starts its own query service on an
    empty snapshot directory of its own."""

    def __init__(self, root: Path, embeddings: EmbeddingsServer) -> None:
        self.root = root
        self.milvus = MilvusLiteServer(root / "milvus", free_port())
        (root / "milvus").mkdir(parents=True)
        self.base = {
            "RAGRPC_MILVUS_URI": self.milvus.uri,
            "RAGRPC_COLLECTION_PREFIX": "built",
            "RAGRPC_EMBEDDING_PROVIDER": "openai",
            "RAGRPC_EMBEDDING_MODEL": "test-embed",
            "RAGRPC_EMBEDDING_BASE_URL": embeddings.url,
            "RAGRPC_EMBEDDING_MAX_RETRIES": "1",
        }
        self.ingest = ServiceProcess("ingest", "ingest_service", free_port(), service_env(dict(self.base)), root)
        self.ingest.env["RAGRPC_INGEST_PORT"] = str(self.ingest.port)

    def query(self, name: str) -> ServiceProcess:
        service = ServiceProcess(name, "query_service", free_port(), service_env(dict(self.base)), self.root)
        service.env.update(
            {"RAGRPC_QUERY_PORT": str(service.port), "RAGRPC_INDEX_SNAPSHOT_DIR": str(self.root / f"{name}-snapshots")}
        )
        return service


def _text(word: str) -> bytes:
    return " ".join(f"Line {i}: the {word} rests on the {word} stone number {i}." for i in range(20)).encode()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuildStack]:
    root = tmp_path_factory.mktemp("build-process")
    with EmbeddingsServer(dimension=64) as embeddings:
        built = BuildStack(root, embeddings)
        try:
            built.milvus.start()
            built.ingest.start()
            for i, word in enumerate(("heron", "crane", "ibis")):
                upload(
                    built.ingest.address,
                    ingest_pb2.DocumentSpec(document_id=f"doc-{i}", file_name="a.txt"),
                    _text(word),
                )
            yield built
        finally:
            built.ingest.kill(signal.SIGTERM, wait_s=20)
            built.milvus.stop()


def _wait_for(predicate: Callable[[], object], timeout_s: float, what: str) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"not within {timeout_s:.0f}s: {what}")


def _build_pid(service: ServiceProcess) -> int:
    found = _wait_for(lambda: BUILD_STARTED.search(service.log_text()), 120, f"the build process of {service.name}")
    assert isinstance(found, re.Match)
    return int(found.group(1))


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (a killed service's child is reaped by whoever adopts it)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


def _found(address: str, word: str) -> set[str]:
    with grpc.insecure_channel(address) as channel:
        request = retrieve_pb2.RetrieveRequest(
            query=word, options=retrieve_pb2.RetrievalOptions(top_k=5, mode=retrieve_pb2.RETRIEVAL_MODE_SPARSE)
        )
        stub = retrieve_pb2_grpc.RetrieveServiceStub(channel)
        return {r.chunk.chunk.document_id for r in stub.Retrieve(request, timeout=30) if r.HasField("chunk")}


def test_a_first_start_builds_its_snapshot_in_a_child_and_starts_from_it(stack: BuildStack) -> None:
    service = stack.query("first")
    service.spawn()
    try:
        pid = _build_pid(service)
        # ingested while the child loads (or just after): the service catches up from the snapshot's watermark
        upload(stack.ingest.address, ingest_pb2.DocumentSpec(document_id="late", file_name="late.txt"), _text("godwit"))
        service.wait_serving(120)
        log = service.log_text()
        assert "the index build process wrote the snapshot" in log
        assert "the index snapshot the build process wrote is loaded" in log
        assert not SERVICE_FULL_LOAD.search(log), "the service itself ran no full load"
        assert re.search(r"query/index-build \[[^\]]*\] query_service\.index_sync: .* loaded: \d+ chunks", log)
        assert not _running(pid), "the build process has exited"
        assert (stack.root / "first-snapshots" / "CURRENT").exists()
        assert _found(service.address, "heron") == {"doc-0"}
        assert _found(service.address, "godwit") == {"late"}
    finally:
        service.kill(signal.SIGTERM, wait_s=30)


def test_a_build_process_killed_midway_costs_the_full_load_in_the_service(stack: BuildStack) -> None:
    service = stack.query("killed-build")
    service.spawn()
    try:
        pid = _build_pid(service)
        os.kill(pid, signal.SIGKILL)
        service.wait_serving(120)
        log = service.log_text()
        assert f"the index build process (pid {pid}) exited with code -9" in log, service.log_tail()
        assert SERVICE_FULL_LOAD.search(log), "the service loaded in full itself"
        assert _found(service.address, "crane") == {"doc-1"}
        _wait_for(
            lambda: (stack.root / "killed-build-snapshots" / "CURRENT").exists(), 30, "the service's own snapshot"
        )
    finally:
        service.kill(signal.SIGTERM, wait_s=30)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_service_stopped_during_the_build_leaves_no_build_process(stack: BuildStack, sig: signal.Signals) -> None:
    """Only the service's own pid is signalled (as an orchestrator does), not its process group."""
    service = stack.query(f"stopped-{sig.name}")
    service.spawn()
    try:
        pid = _build_pid(service)
        assert service.process is not None
        os.kill(service.pid, sig)
        code = service.process.wait(timeout=60)
        _wait_for(lambda: not _running(pid), 15, f"the build process {pid} gone after {sig.name} to the service")
        if sig == signal.SIGTERM:
            assert code == 0, service.log_tail()
    finally:
        service.kill(signal.SIGKILL, wait_s=10)
