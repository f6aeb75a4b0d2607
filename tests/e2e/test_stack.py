"""End to end, as a user runs it: `scripts/stack.sh start` (what `make run` does) starts the
milvus-lite server, the ingest service and the query service as three OS processes; we
ingest through one and ask through the other, restart pieces, and check nothing is lost."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc, retrieve_pb2, retrieve_pb2_grpc
from tests.support.milvus_server import free_port

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
FRESHNESS_S = 2.0  # acknowledged ingestion -> searchable in the query service (README, Freshness)


def _stack(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "stack.sh"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )


@pytest.fixture(scope="module")
def stack_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    data = tmp_path_factory.mktemp("stack")
    env = {
        **os.environ,
        "RAGRPC_DATA_DIR": str(data),
        "RAGRPC_MILVUS_PORT": str(free_port()),
        "RAGRPC_INGEST_PORT": str(free_port()),
        "RAGRPC_QUERY_PORT": str(free_port()),
        "RAGRPC_INGEST_METRICS_PORT": str(free_port()),
        "RAGRPC_QUERY_METRICS_PORT": str(free_port()),
        "VENV": str(Path(sys.executable).parent.parent),
    }
    env.pop("RAGRPC_MILVUS_URI", None)
    started = _stack(env, "start")
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        yield env
    finally:
        _stack(env, "stop")


def _upload(address: str, path: Path) -> ingest_pb2.UploadDocumentResponse:
    def messages() -> Iterator[ingest_pb2.UploadDocumentRequest]:
        yield ingest_pb2.UploadDocumentRequest(
            header=ingest_pb2.DocumentSpec(file_name=path.name, document_id=path.stem)
        )
        yield ingest_pb2.UploadDocumentRequest(data=path.read_bytes())

    with grpc.insecure_channel(address) as channel:
        return ingest_pb2_grpc.IngestServiceStub(channel).UploadDocument(messages(), timeout=120)


def _ask(address: str, question: str) -> list[retrieve_pb2.AskResponse]:
    with grpc.insecure_channel(address) as channel:
        return list(
            retrieve_pb2_grpc.RetrieveServiceStub(channel).Ask(retrieve_pb2.AskRequest(query=question), timeout=120)
        )


def test_ingest_in_one_process_answer_from_another(stack_env: dict[str, str]) -> None:
    ingest = f"127.0.0.1:{stack_env['RAGRPC_INGEST_PORT']}"
    query = f"127.0.0.1:{stack_env['RAGRPC_QUERY_PORT']}"
    pids = {
        n: (Path(stack_env["RAGRPC_DATA_DIR"]) / "run" / f"{n}.pid").read_text().strip()
        for n in ("milvus", "ingest", "query")
    }
    assert len(set(pids.values())) == 3  # three separate OS processes
    uploaded = _upload(ingest, REPO / "samples" / "operations.md")
    assert uploaded.document.state == ingest_pb2.DOCUMENT_STATE_ACTIVE
    acknowledged = time.monotonic()
    while True:  # searchable in the other process once it has followed the registry (its next poll)
        events = _ask(query, "What does the recovery step do after the ingest service is killed?")
        cited = {e.citation.document_id for e in events if e.HasField("citation")}
        if "operations" in cited or time.monotonic() - acknowledged > FRESHNESS_S:
            break
        time.sleep(0.1)
    assert "operations" in cited, f"not searchable {FRESHNESS_S} s after the upload was acknowledged"
    assert events[-1].final.model == "extractive" and events[-1].final.answer

    again = _upload(ingest, REPO / "samples" / "operations.md")
    assert again.unchanged and again.document.chunk_count == uploaded.document.chunk_count


def test_restarts_lose_nothing(stack_env: dict[str, str]) -> None:
    ingest = f"127.0.0.1:{stack_env['RAGRPC_INGEST_PORT']}"
    query = f"127.0.0.1:{stack_env['RAGRPC_QUERY_PORT']}"
    uploaded = _upload(ingest, REPO / "samples" / "faq.txt")
    assert _stack(stack_env, "stop").returncode == 0  # all three, including milvus-lite
    started = _stack(stack_env, "start")
    assert started.returncode == 0, started.stdout + started.stderr
    with grpc.insecure_channel(ingest) as channel:
        doc = (
            ingest_pb2_grpc.IngestServiceStub(channel)
            .GetDocument(ingest_pb2.GetDocumentRequest(document_id="faq"), timeout=30)
            .document
        )
    assert doc.state == ingest_pb2.DOCUMENT_STATE_ACTIVE and doc.chunk_count == uploaded.document.chunk_count
    events = _ask(query, "What happens when the same file is ingested twice?")
    assert "faq" in {e.source.chunk.document_id for e in events if e.HasField("source")}


def _scrape(port: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def test_metrics_move_after_calls(stack_env: dict[str, str]) -> None:
    query = f"127.0.0.1:{stack_env['RAGRPC_QUERY_PORT']}"
    before = _scrape(stack_env["RAGRPC_QUERY_METRICS_PORT"])
    _ask(query, "How do query services scale?")
    after = _scrape(stack_env["RAGRPC_QUERY_METRICS_PORT"])
    key = 'ragrpc_rpc_requests_total{code="OK",method="Ask",service="ragrpc.v1.RetrieveService"}'
    assert after[key] == before.get(key, 0.0) + 1
    assert after['ragrpc_tokens_generated_total{model="extractive"}'] > 0
    assert after["ragrpc_time_to_first_token_seconds_count"] >= 1
    ingested = _upload(f"127.0.0.1:{stack_env['RAGRPC_INGEST_PORT']}", REPO / "samples" / "architecture.md")
    ingest_metrics = _scrape(stack_env["RAGRPC_INGEST_METRICS_PORT"])
    assert ingest_metrics["ragrpc_chunks_written_total"] >= ingested.document.chunk_count > 0
    assert any(k.startswith("ragrpc_ingest_stage_seconds_count") for k in ingest_metrics)
