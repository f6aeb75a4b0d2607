"""Load: concurrent ingestion plus 16 concurrent Ask streams against the real processes
(milvus-lite server, ingest service, query service, real model) on 127.0.0.1.

No call may fail (any error counts), latencies are reported (p50/p90/p99, requests/s), and the
resident memory of both services (and of milvus-lite) is sampled during the run: the growth from
the end of the warm-up to the end must stay below a generous bound.

    test_soak_smoke   ~25 s of load (slow)       test_soak   3 minutes (--run-reliability)
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc
import pytest

from ragrpc.testing.invariants import check_store
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc, retrieve_pb2, retrieve_pb2_grpc
from tests.reliability.conftest import RealStack, health, latency_summary, rss_kib
from tests.support import hostile_inputs as hi

ASK_STREAMS = 16
RSS_GROWTH_LIMIT = 0.30  # after warm-up
QUESTIONS = (
    "What do ducks eat?",
    "Where do mallards live?",
    "How are tables rendered in Markdown?",
    "What does the README say about installation?",
    "Which formats are supported?",
    "What is a description list?",
    "Who wrote the document?",
    "How do I run the tests?",
    "What happened in the changelog?",
    "Which code snippets are shown?",
    "What is the lorem ipsum text about?",
    "How many columns does the table have?",
)
SEED_FILES = (
    "markdown/docling__duck.md",
    "markdown/docling__wiki.md",
    "markdown/pypdf__README.md",
    "html/docling__html_code_snippets.html",
    "html/docling__html_description_list.html",
    "docx/docling__lorem_ipsum.docx",
    "docx/docling__word_tables.docx",
    "markdown/docling__README.md",
)
INGEST_FILES = (
    "markdown/docling__mixed.md",
    "markdown/docling__nested.md",
    "html/docling__example_03.html",
    "html/docling__formatting.html",
    "docx/docling__docx_lists.docx",
    "markdown/docling__blocks.md",
    "html/docling__kvp_data_example.html",
    "docx/docling__unit_test_headers.docx",
)

pytestmark = pytest.mark.skipif(not hi.CORPUS.is_dir(), reason=f"corpus {hi.CORPUS} is missing")


@dataclass
class Load:
    ask_latency: list[float] = field(default_factory=list)
    ask_first_token: list[float] = field(default_factory=list)
    ask_done_at: list[float] = field(default_factory=list)
    ingest_latency: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    error_samples: list[str] = field(default_factory=list)
    answers_without_sources: int = 0
    rss: dict[str, list[tuple[float, int]]] = field(default_factory=dict)

    def error(self, what: str, exc: grpc.aio.AioRpcError) -> None:
        self.errors[f"{what}:{exc.code().name}"] += 1
        if len(self.error_samples) < 10:
            self.error_samples.append(f"{what}: {exc.code().name}: {(exc.details() or '')[:200]}")


def _corpus(names: tuple[str, ...]) -> list[hi.CorpusFile]:
    found = {c.relative: c for c in hi.corpus_files()}
    return [found[n] for n in names if n in found]


async def _upload(stub: ingest_pb2_grpc.IngestServiceStub, spec: ingest_pb2.DocumentSpec, content: bytes) -> None:
    async def messages():  # type: ignore[no-untyped-def]
        yield ingest_pb2.UploadDocumentRequest(header=spec)
        yield ingest_pb2.UploadDocumentRequest(data=content)

    await stub.UploadDocument(messages(), timeout=300)


async def _ask_loop(address: str, until: float, load: Load, rng: random.Random) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = retrieve_pb2_grpc.RetrieveServiceStub(channel)
        while time.monotonic() < until:
            started = time.monotonic()
            first_token = None
            try:
                kinds = Counter()
                async for event in stub.Ask(retrieve_pb2.AskRequest(query=rng.choice(QUESTIONS)), timeout=120):
                    kind = event.WhichOneof("event")
                    kinds[kind] += 1
                    if kind == "token" and first_token is None:
                        first_token = time.monotonic() - started
                if not kinds["source"]:
                    load.answers_without_sources += 1
                if not kinds["final"]:
                    load.errors["Ask:NO_FINAL"] += 1
                load.ask_latency.append(time.monotonic() - started)
                load.ask_done_at.append(time.monotonic())
                if first_token is not None:
                    load.ask_first_token.append(first_token)
            except grpc.aio.AioRpcError as exc:
                load.error("Ask", exc)


async def _ingest_loop(address: str, until: float, load: Load) -> None:
    files = _corpus(INGEST_FILES)
    revision = 0
    async with grpc.aio.insecure_channel(address) as channel:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        while time.monotonic() < until:
            item = files[revision % len(files)]
            revision += 1
            content = item.path.read_bytes()
            if item.path.suffix in (".md", ".html"):
                content += f"\n\nSoak revision {revision}.\n".encode()
            started = time.monotonic()
            try:
                await _upload(
                    stub,
                    ingest_pb2.DocumentSpec(file_name=item.path.name, document_id=f"soak-{revision % 12}"),
                    content,
                )
                load.ingest_latency.append(time.monotonic() - started)
            except grpc.aio.AioRpcError as exc:
                load.error("UploadDocument", exc)


async def _sample_rss(processes: dict[str, int], until: float, load: Load) -> None:
    while time.monotonic() < until:
        now = time.monotonic()
        for name, pid in processes.items():
            load.rss.setdefault(name, []).append((now, rss_kib(pid)))
        await asyncio.sleep(1.0)


def _rss_at(samples: list[tuple[float, int]], when: float) -> int:
    before = [kib for at, kib in samples if at <= when]
    return before[-1] if before else samples[0][1]


async def _soak(stack: RealStack, duration_s: float, warmup_s: float) -> None:
    assert stack.ingest is not None and stack.query is not None and stack.milvus is not None
    assert stack.milvus.process is not None
    async with grpc.aio.insecure_channel(stack.ingest.address) as channel:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        for item in _corpus(SEED_FILES):
            await _upload(
                stub,
                ingest_pb2.DocumentSpec(file_name=item.path.name, document_id=f"seed-{item.path.stem}"),
                item.path.read_bytes(),
            )
    load = Load()
    processes = {"ingest": stack.ingest.pid, "query": stack.query.pid, "milvus-lite": stack.milvus.process.pid}
    started = time.monotonic()
    until = started + duration_s
    rng = random.Random(42)
    tasks = [
        asyncio.create_task(_ask_loop(stack.query.address, until, load, random.Random(rng.random())))
        for _ in range(ASK_STREAMS)
    ]
    tasks.append(asyncio.create_task(_ingest_loop(stack.ingest.address, until, load)))
    tasks.append(asyncio.create_task(_sample_rss(processes, until + 1.0, load)))
    await asyncio.gather(*tasks)
    elapsed = time.monotonic() - started
    warm = started + warmup_s
    steady = [lat for lat, done in zip(load.ask_latency, load.ask_done_at, strict=True) if done >= warm]
    print(
        f"\n=== soak: {ASK_STREAMS} Ask streams + 1 ingestion loop for {elapsed:.0f}s "
        f"(warm-up {warmup_s:.0f}s) on 127.0.0.1 ==="
    )
    print(
        f"Ask: {len(load.ask_latency)} answers, {len(load.ask_latency) / elapsed:.1f} req/s; "
        f"latency {latency_summary(load.ask_latency)}"
    )
    print(f"Ask after warm-up: {latency_summary(steady)}; time to first token {latency_summary(load.ask_first_token)}")
    print(
        f"UploadDocument: {len(load.ingest_latency)} documents ({len(load.ingest_latency) / elapsed * 60:.0f}/min); "
        f"latency {latency_summary(load.ingest_latency)}"
    )
    print(f"errors: {dict(load.errors) or 'none'}; answers without sources: {load.answers_without_sources}")
    growth = {}
    for name, samples in load.rss.items():
        first, at_warm, last = samples[0][1], _rss_at(samples, warm), samples[-1][1]
        peak = max(kib for _, kib in samples)
        growth[name] = (last - at_warm) / max(1, at_warm)
        print(
            f"RSS {name:12s} start {first / 1024:7.0f} MiB  after warm-up {at_warm / 1024:7.0f} MiB  "
            f"end {last / 1024:7.0f} MiB  peak {peak / 1024:7.0f} MiB  growth after warm-up {growth[name]:+.1%}"
        )
    stores = stack.reader_stores()
    report = check_store(stores.chunks, stores.registry)
    print(f"Milvus after the soak: {report.summary()}")
    assert not load.errors, load.error_samples
    assert len(load.ask_latency) >= ASK_STREAMS, "too few answers"
    assert health(stack.ingest.address) == "SERVING" and health(stack.query.address) == "SERVING"
    for name in ("ingest", "query"):
        assert growth[name] < RSS_GROWTH_LIMIT, f"{name} RSS grew {growth[name]:.0%} after warm-up"
    assert not report.problems, report.problems


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_soak_smoke(shared_real_stack: RealStack) -> None:
    await _soak(shared_real_stack, duration_s=25.0, warmup_s=8.0)


@pytest.mark.reliability
@pytest.mark.timeout(1800)
async def test_soak(shared_real_stack: RealStack) -> None:
    await _soak(shared_real_stack, duration_s=180.0, warmup_s=45.0)
