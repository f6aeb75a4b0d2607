"""Shared fixtures: in-process gRPC servers on 127.0.0.1:0 built by the real composition
roots, over deterministic fakes (hashing embedder, in-memory stores) unless a test asks for
the real model and a real milvus-lite server (tests/integration)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ragrpc.config import Settings
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_EVAL = REPO_ROOT.parent / "shared" / "eval"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-reliability",
        action="store_true",
        default=False,
        help="run the long reliability tests (make test-reliability)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-reliability"):
        return
    skip = pytest.mark.skip(reason="long reliability test: run with make test-reliability")
    for item in items:
        if item.get_closest_marker("reliability") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def cli_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's own state directory of the `ragrpc` CLI (its read-your-writes token), so that one
    test's writes are never waited for by another's searches."""
    state = tmp_path_factory.mktemp("cli-state")
    monkeypatch.setenv("RAGRPC_CLI_STATE_DIR", str(state))
    return state


@pytest.fixture
def settings() -> Settings:
    return dataclasses.replace(
        Settings(),
        host="127.0.0.1",
        ingest_port=0,
        query_port=0,
        workers=2,
        embedding_batch_size=16,
        embedding_call_size=16,
        sparse_backend="rank_bm25",
        registry_follow_interval_s=0.05,
    )


@dataclass
class FakeStack:
    embedder: HashingEmbedder
    chunks: InMemoryChunkStore
    registry: InMemoryDocumentRegistry
    ingest_address: str = ""
    query_address: str = ""
    follower: Any = None  # the query service's RegistryFollower, once running
    ingest: Any = None  # the ingest service's IngestComponents, once running

    def caught_up(self, timeout_s: float = 10.0) -> None:
        """Blocks (call it from a thread, or via `await stack.followed()`) until the query service's
        background task has completed a poll that started after this call: what was acknowledged
        before is then searchable by BM25 too (the freshness window of RAGRPC_REGISTRY_FOLLOW_INTERVAL_S)."""
        target = self.follower.polls + 2
        deadline = time.monotonic() + timeout_s
        while self.follower.polls < target:
            if time.monotonic() > deadline:
                raise TimeoutError("the query service's registry follower did not poll")
            time.sleep(0.005)

    async def followed(self) -> None:
        await asyncio.to_thread(self.caught_up)


@pytest.fixture
def fake_stores() -> FakeStack:
    return FakeStack(HashingEmbedder(), InMemoryChunkStore(), InMemoryDocumentRegistry())


@asynccontextmanager
async def running_stack(settings: Settings, stores: FakeStack) -> AsyncIterator[FakeStack]:
    """Both services in-process over the given stores, each on its own port 0 address."""
    from ingest_service.app import build_components as build_ingest
    from ingest_service.app import start_ingest_server
    from query_service.app import build_components as build_query
    from query_service.app import start_query_server

    ingest = build_ingest(settings, stores.embedder, stores.chunks, stores.registry)
    query = build_query(settings, stores.embedder, stores.chunks, stores.registry)
    ingest_server = await start_ingest_server(settings, ingest, "127.0.0.1:0")
    query_server = await start_query_server(settings, query, "127.0.0.1:0")
    stores.follower = query.follower
    stores.ingest = ingest
    stores.ingest_address = f"127.0.0.1:{ingest_server.port}"
    stores.query_address = f"127.0.0.1:{query_server.port}"
    try:
        yield stores
    finally:
        await ingest_server.stop(0)
        await query_server.stop(0)
        ingest.shutdown()
        query.executor.shutdown(wait=False, cancel_futures=True)


@pytest.fixture
async def fake_stack(settings: Settings, fake_stores: FakeStack) -> AsyncIterator[FakeStack]:
    """Both services in-process over the same in-memory stores, each on its own port."""
    async with running_stack(settings, fake_stores) as stack:
        yield stack


# --- tracing: spans recorded in memory by the OpenTelemetry SDK (imported only by tests that ask) ---


@pytest.fixture
def exporter() -> Any:
    """The in-memory span exporter that `tracer` records into."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    return InMemorySpanExporter()


@pytest.fixture
def tracer(exporter: Any) -> Any:
    """An OtelTracer whose finished spans go to `exporter`."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from ragrpc.tracing import OtelTracer

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OtelTracer(provider)
