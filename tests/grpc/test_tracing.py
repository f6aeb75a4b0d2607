"""Tracing through the real query service over gRPC, recorded by the OpenTelemetry SDK's
in-memory exporter: one RPC span per call (the caller's traceparent continued), each pipeline
stage a child span of it with the attributes an operator needs. (The tracer alone, and the
default that imports no OpenTelemetry: tests/unit/test_tracer.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

# The `tracing` extra is part of `make install`: a missing package fails here, it is not skipped.
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from ragrpc.config import Settings  # noqa: E402
from ragrpc.models import ChunkRecord, DocumentRecord, DocumentState, ScoredChunk  # noqa: E402
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry  # noqa: E402
from ragrpc.tracing import QUERY_STAGES, OtelTracer  # noqa: E402
from ragrpc.v1 import retrieve_pb2, retrieve_pb2_grpc  # noqa: E402
from tests.conftest import FakeStack  # noqa: E402
from tests.support.chat_server import Behaviour, ChatServer  # noqa: E402

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN_ID = "b7ad6b7169203331"
TRACEPARENT = (("traceparent", f"00-{TRACE_ID}-{CALLER_SPAN_ID}-01"),)
DOCS = {
    "ducks": "Mallards are dabbling ducks that live near lakes and rivers across the northern hemisphere.",
    "geese": "Canada geese migrate south in large flocks and graze on grass near ponds.",
    "owls": "Barn owls hunt small mammals at night, finding them by sound alone.",
}


class ReversingReranker:
    """Reverses the candidates (rerank scores 1, 2, ... from the last); notes the span current in its thread."""

    model_name_or_path = "test/reversing-reranker"

    def __init__(self) -> None:
        self.spans_seen: list[int] = []

    def rerank(self, query: str, hits: Sequence[ScoredChunk], top_n: int) -> list[ScoredChunk]:
        self.spans_seen.append(trace.get_current_span().get_span_context().span_id)
        out = [
            dataclasses.replace(hit, score=float(i), scores=dataclasses.replace(hit.scores, rerank=float(i)))
            for i, hit in enumerate(reversed(hits), start=1)
        ]
        return sorted(out, key=lambda h: -h.score)[:top_n]


def _seed(settings: Settings, stack: FakeStack) -> None:
    """One ACTIVE document of one chunk per entry of DOCS, written straight into the stores."""
    for document_id, text in DOCS.items():
        [vector] = stack.embedder.embed_documents([text])
        chunk = ChunkRecord(
            chunk_id=f"{document_id}-0",
            document_id=document_id,
            tenant=settings.tenant,
            collection="default",
            generation="g1",
            text=text,
            vector=[float(x) for x in vector],
            chunk_index=0,
            chunker="test",
            title=document_id,
            media_type="text/plain",
        )
        stack.chunks.insert_chunks([chunk])
        stack.registry.put(
            DocumentRecord(
                tenant=settings.tenant,
                document_id=document_id,
                title=document_id,
                media_type="text/plain",
                state=DocumentState.ACTIVE,
                chunk_count=1,
                generation="g1",
            )
        )


@asynccontextmanager
async def traced_stack(
    settings: Settings, tracer: OtelTracer, reranker: ReversingReranker | None
) -> AsyncIterator[FakeStack]:
    """The query service with `tracer` over in-memory stores holding DOCS."""
    from query_service.app import build_components, start_query_server

    stack = FakeStack(HashingEmbedder(), InMemoryChunkStore(), InMemoryDocumentRegistry())
    _seed(settings, stack)
    query = build_components(settings, stack.embedder, stack.chunks, stack.registry, reranker=reranker, tracer=tracer)
    server = await start_query_server(settings, query, "127.0.0.1:0")
    stack.follower = query.follower
    stack.query_address = f"127.0.0.1:{server.port}"
    try:
        yield stack
    finally:
        await server.stop(0)
        query.executor.shutdown(wait=False, cancel_futures=True)


def _attrs(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


def _by_name(spans: Sequence[ReadableSpan]) -> dict[str, ReadableSpan]:
    named: dict[str, ReadableSpan] = {}
    for span in spans:
        assert span.name not in named, f"two {span.name} spans"
        named[span.name] = span
    return named


def _rpc_span(spans: dict[str, ReadableSpan], method: str) -> ReadableSpan:
    rpc = spans[f"/ragrpc.v1.RetrieveService/{method}"]
    assert rpc.kind == trace.SpanKind.SERVER
    assert _attrs(rpc)["rpc.system"] == "grpc"
    assert _attrs(rpc)["rpc.service"] == "ragrpc.v1.RetrieveService"
    assert _attrs(rpc)["rpc.method"] == method
    # the caller's trace is continued
    assert f"{rpc.context.trace_id:032x}" == TRACE_ID
    assert rpc.parent is not None and f"{rpc.parent.span_id:016x}" == CALLER_SPAN_ID
    assert rpc.parent.is_remote
    return rpc


def _assert_children(spans: dict[str, ReadableSpan], rpc: ReadableSpan, names: Sequence[str]) -> None:
    for name in names:
        span = spans[name]
        assert span.parent is not None and span.parent.span_id == rpc.context.span_id, f"{name} is not a child"
        assert span.context.trace_id == rpc.context.trace_id
        times = (rpc.start_time, span.start_time, span.end_time, rpc.end_time)
        assert None not in times and sorted(times) == list(times), name  # type: ignore[type-var]


async def test_retrieve_spans(settings: Settings, tracer: OtelTracer, exporter: InMemorySpanExporter) -> None:
    reranker = ReversingReranker()
    async with traced_stack(settings, tracer, reranker) as stack:
        exporter.clear()
        async with grpc.aio.insecure_channel(stack.query_address) as channel:
            request = retrieve_pb2.RetrieveRequest(
                query="Where do mallard ducks live?", options=retrieve_pb2.RetrievalOptions(top_k=2, candidates=20)
            )
            responses = [
                r async for r in retrieve_pb2_grpc.RetrieveServiceStub(channel).Retrieve(request, metadata=TRACEPARENT)
            ]
    assert responses[-1].summary.reranked
    spans = _by_name(exporter.get_finished_spans())
    rpc = _rpc_span(spans, "Retrieve")
    assert _attrs(rpc)["rpc.grpc.status_code"] == 0
    stages = ["embed_query", "dense", "sparse", "fuse", "rerank"]
    assert set(spans) == {rpc.name, *stages}
    _assert_children(spans, rpc, stages)
    assert all(spans[name].kind == trace.SpanKind.INTERNAL for name in stages)

    embed = _attrs(spans["embed_query"])
    assert embed["gen_ai.request.model"] == "test/hashing-embedder"
    assert embed["gen_ai.operation.name"] == "embeddings"
    assert embed["ragrpc.embed_query.query_chars"] == len("Where do mallard ducks live?")
    dense = _attrs(spans["dense"])
    assert dense["ragrpc.dense.requested"] == 20 and dense["ragrpc.dense.hits"] == 3
    sparse = _attrs(spans["sparse"])
    assert sparse["ragrpc.sparse.backend"] == "rank_bm25" and sparse["ragrpc.sparse.requested"] == 20
    assert sparse["ragrpc.sparse.query_words"] == 5 and "ragrpc.sparse.added_terms" not in sparse  # no enricher
    assert 1 <= sparse["ragrpc.sparse.hits"] <= 3
    fuse = _attrs(spans["fuse"])
    assert fuse["ragrpc.fuse.method"] == "rrf" and fuse["ragrpc.fuse.rrf_k"] == 20  # RAGRPC_RRF_K
    assert fuse["ragrpc.fuse.dense_in"] == 3 and fuse["ragrpc.fuse.sparse_in"] == sparse["ragrpc.sparse.hits"]
    assert fuse["ragrpc.fuse.out"] == 3
    rerank = _attrs(spans["rerank"])
    assert rerank["ragrpc.rerank.provider"] == "ReversingReranker"
    assert rerank["ragrpc.rerank.model"] == "test/reversing-reranker"
    assert rerank["ragrpc.rerank.n_in"] == 3 and rerank["ragrpc.rerank.n_out"] == 3
    assert rerank["ragrpc.rerank.reranked"] is True and "ragrpc.rerank.skipped_reason" not in rerank
    # the executor thread ran in the caller's context: the rerank span was current there
    assert reranker.spans_seen == [spans["rerank"].context.span_id]


async def test_ask_spans_with_an_llm_endpoint(
    settings: Settings, tracer: OtelTracer, exporter: InMemorySpanExporter
) -> None:
    with ChatServer(Behaviour.stream("Mallards live near lakes and rivers [1].", delay_s=0.01)) as chat:
        configured = dataclasses.replace(settings, llm_endpoints=f"{chat.url}|m1|NO_KEY_SET|5")
        async with traced_stack(configured, tracer, ReversingReranker()) as stack:
            exporter.clear()
            async with grpc.aio.insecure_channel(stack.query_address) as channel:
                request = retrieve_pb2.AskRequest(query="Where do mallards live?", token_budget=2000)
                events = [
                    e async for e in retrieve_pb2_grpc.RetrieveServiceStub(channel).Ask(request, metadata=TRACEPARENT)
                ]
    final = events[-1].final
    assert final.model == "m1"
    spans = _by_name(exporter.get_finished_spans())
    rpc = _rpc_span(spans, "Ask")
    assert set(spans) == {rpc.name, *QUERY_STAGES}
    _assert_children(spans, rpc, QUERY_STAGES)
    assert (spans["context"].end_time or 0) <= (spans["generate"].start_time or 0)

    context = _attrs(spans["context"])
    assert context["ragrpc.context.budget_tokens"] == 2000
    assert context["ragrpc.context.hits"] == 3 and context["ragrpc.context.template"] == "default"
    assert 1 <= context["ragrpc.context.sources"] <= 3
    assert context["ragrpc.context.chunks"] >= context["ragrpc.context.sources"]
    assert 0 < context["ragrpc.context.tokens"] < context["ragrpc.context.prompt_tokens"] <= 2000
    assert context["ragrpc.context.dropped"] == 0
    generate = _attrs(spans["generate"])
    assert generate["gen_ai.operation.name"] == "chat"
    assert generate["gen_ai.request.model"] == generate["gen_ai.response.model"] == "m1"
    assert generate["server.address"] == "127.0.0.1" and generate["ragrpc.generate.extractive"] is False
    assert generate["ragrpc.generate.endpoint"].startswith("http://127.0.0.1:")
    assert generate["gen_ai.usage.input_tokens"] == final.usage.prompt_tokens > 0
    assert generate["gen_ai.usage.output_tokens"] == final.usage.completion_tokens > 0
    assert tuple(generate["gen_ai.response.finish_reasons"]) == ("stop",)
    assert generate["ragrpc.generate.fallbacks"] == 0 and generate["ragrpc.generate.retractions"] == 0
    assert generate["ragrpc.generate.generators"] == 2 and generate["ragrpc.generate.sources"] >= 1


async def test_ask_fallback_is_on_the_generate_span(
    settings: Settings, tracer: OtelTracer, exporter: InMemorySpanExporter
) -> None:
    with ChatServer(Behaviour.error(500)) as chat:
        configured = dataclasses.replace(settings, llm_endpoints=f"{chat.url}|m1|NO_KEY_SET|5")
        async with traced_stack(configured, tracer, None) as stack:
            exporter.clear()
            async with grpc.aio.insecure_channel(stack.query_address) as channel:
                request = retrieve_pb2.AskRequest(query="Where do mallards live?")
                events = [e async for e in retrieve_pb2_grpc.RetrieveServiceStub(channel).Ask(request)]
    spans = _by_name(exporter.get_finished_spans())
    rpc = spans["/ragrpc.v1.RetrieveService/Ask"]
    assert rpc.parent is None  # no traceparent: a new trace
    _assert_children(spans, rpc, QUERY_STAGES)
    generate = spans["generate"]
    assert _attrs(generate)["ragrpc.generate.fallbacks"] == 1
    assert _attrs(generate)["ragrpc.generate.extractive"] is True
    assert _attrs(generate)["gen_ai.response.model"] == events[-1].final.model
    assert "server.address" not in _attrs(generate)
    [failed] = [e for e in generate.events if e.name == "generator_failed"]
    assert _attrs(failed)["model"] == "m1" and "500" in _attrs(failed)["problem"]
    rerank = _attrs(spans["rerank"])
    assert rerank["ragrpc.rerank.skipped_reason"] == "no reranker configured"
    assert rerank["ragrpc.rerank.reranked"] is False and "ragrpc.rerank.provider" not in rerank


async def test_error_status_on_the_rpc_span_and_health_untraced(
    settings: Settings, tracer: OtelTracer, exporter: InMemorySpanExporter
) -> None:
    async with traced_stack(settings, tracer, None) as stack:
        exporter.clear()
        async with grpc.aio.insecure_channel(stack.query_address) as channel:
            stub = retrieve_pb2_grpc.RetrieveServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                _ = [r async for r in stub.Retrieve(retrieve_pb2.RetrieveRequest(query="  "), metadata=TRACEPARENT)]
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    [rpc] = exporter.get_finished_spans()  # no span for the health check, no stage ran
    assert rpc.name == "/ragrpc.v1.RetrieveService/Retrieve"
    assert _attrs(rpc)["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert f"{rpc.context.trace_id:032x}" == TRACE_ID


async def test_a_cancelled_ask_ends_its_spans(
    settings: Settings, tracer: OtelTracer, exporter: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    with ChatServer(Behaviour.stream("Mallards live near lakes and rivers [1]. " * 20, delay_s=0.2)) as chat:
        configured = dataclasses.replace(settings, llm_endpoints=f"{chat.url}|m1|NO_KEY_SET|5")
        async with traced_stack(configured, tracer, None) as stack:
            exporter.clear()
            async with grpc.aio.insecure_channel(stack.query_address) as channel:
                call = retrieve_pb2_grpc.RetrieveServiceStub(channel).Ask(
                    retrieve_pb2.AskRequest(query="Where do mallards live?"), metadata=TRACEPARENT
                )
                async for event in call:
                    if event.HasField("token"):
                        call.cancel()
                        break
                for _ in range(200):  # the server notices the cancellation and closes the stream
                    if any(s.name == "/ragrpc.v1.RetrieveService/Ask" for s in exporter.get_finished_spans()):
                        break
                    await asyncio.sleep(0.01)
    spans = _by_name(exporter.get_finished_spans())
    rpc = _rpc_span(spans, "Ask")
    _assert_children(spans, rpc, QUERY_STAGES)
    assert "gen_ai.usage.output_tokens" not in _attrs(spans["generate"])  # it never finished
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")], "context detached out of order"


async def test_global_grpc_instrumentation_is_not_doubled(
    settings: Settings, tracer: OtelTracer, exporter: InMemorySpanExporter
) -> None:
    """Under opentelemetry-instrument, grpc.aio servers are instrumented globally: no second RPC span."""
    from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorServer

    instrumentor = GrpcAioInstrumentorServer()
    instrumentor.instrument(tracer_provider=tracer._provider)
    try:
        assert tracer.server_interceptor() is None
        async with traced_stack(settings, tracer, None) as stack:
            exporter.clear()
            async with grpc.aio.insecure_channel(stack.query_address) as channel:
                request = retrieve_pb2.RetrieveRequest(query="Where do mallard ducks live?")
                _ = [
                    r
                    async for r in retrieve_pb2_grpc.RetrieveServiceStub(channel).Retrieve(
                        request, metadata=TRACEPARENT
                    )
                ]
    finally:
        instrumentor.uninstrument()
    assert tracer.server_interceptor() is not None
    spans = _by_name(exporter.get_finished_spans())  # one span of each name
    _assert_children(spans, _rpc_span(spans, "Retrieve"), ["embed_query", "dense", "sparse", "fuse", "rerank"])


async def test_an_upload_has_a_span_per_ingest_stage_under_its_rpc_span(
    settings: Settings, tracer: OtelTracer, exporter: InMemorySpanExporter
) -> None:
    from ingest_service.app import build_components, start_ingest_server
    from ragrpc.tracing import INGEST_STAGES
    from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc

    stack = FakeStack(HashingEmbedder(), InMemoryChunkStore(), InMemoryDocumentRegistry())
    ingest = build_components(settings, stack.embedder, stack.chunks, stack.registry, tracer=tracer)
    server = await start_ingest_server(settings, ingest, "127.0.0.1:0")
    text = " ".join(DOCS.values()) * 8
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = ingest_pb2_grpc.IngestServiceStub(channel)
            header = ingest_pb2.DocumentSpec(document_id="birds", file_name="birds.txt")
            messages = [
                ingest_pb2.UploadDocumentRequest(header=header),
                ingest_pb2.UploadDocumentRequest(data=text.encode()),
            ]
            response = await stub.UploadDocument(iter(messages), metadata=TRACEPARENT)
    finally:
        await server.stop(0)
        ingest.shutdown()
    spans = _by_name(exporter.get_finished_spans())
    rpc = spans["/ragrpc.v1.IngestService/UploadDocument"]
    assert rpc.context.trace_id == int(TRACE_ID, 16)
    for stage in INGEST_STAGES:
        assert spans[stage].parent is not None and spans[stage].parent.span_id == rpc.context.span_id, stage
    assert _attrs(spans["extract"])["ragrpc.extract.size_bytes"] == len(text.encode())
    assert _attrs(spans["extract"])["ragrpc.extract.media_type"] == "text/plain"
    assert _attrs(spans["chunk"])["ragrpc.chunk.chunks"] == response.document.chunk_count
    assert _attrs(spans["embed"])["ragrpc.embed.chunks"] == response.document.chunk_count
    assert _attrs(spans["embed"])["gen_ai.request.model"] == stack.embedder.model_id
    assert _attrs(spans["write"])["ragrpc.write.replacing"] is False
