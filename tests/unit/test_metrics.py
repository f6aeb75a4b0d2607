"""MetricsInterceptor on a real aio server (built by ragrpc.server.build_server, so the error
mapping interceptor sits outside it as in production), scraped over real HTTP."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from ragrpc import errors
from ragrpc.metrics import Metrics, MetricsHttpServer, MetricsInterceptor, serve_metrics, split_method
from ragrpc.server import RunningServer, ServiceRegistration, build_server

SERVICE = "test.v1.EchoService"


async def _echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    if request == b"abort":
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "echo refuses 'abort'")
    if request == b"missing":
        raise errors.NotFoundError("no such thing")
    if request == b"boom":
        raise ValueError("a bug")
    if request == b"slow":
        await asyncio.sleep(5)
    return request


async def _count(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    for i in range(3):
        if request == b"abort" and i == 1:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "stream refuses 'abort'")
        yield str(i).encode()


async def _join(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
    return b"".join([piece async for piece in requests])


def _register(server: grpc.aio.Server) -> None:
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Echo": grpc.unary_unary_rpc_method_handler(_echo),
            "Count": grpc.unary_stream_rpc_method_handler(_count),
            "Join": grpc.stream_unary_rpc_method_handler(_join),
        },
    )
    server.add_generic_rpc_handlers((handler,))


@dataclass
class Stack:
    metrics: Metrics
    running: RunningServer
    http: MetricsHttpServer
    channel: grpc.aio.Channel

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        url = f"http://127.0.0.1:{self.http.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback only
            assert response.status == 200
            text = response.read().decode()
        samples = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return samples

    async def rpc_count(self, method: str, code: str) -> float:
        samples = await asyncio.to_thread(self.scrape)
        labels = (("code", code), ("method", method), ("service", SERVICE))
        return samples.get(("ragrpc_rpc_requests_total", labels), 0.0)


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    metrics = Metrics()
    running = await build_server(
        [ServiceRegistration(SERVICE, _register)],
        address="127.0.0.1:0",
        max_message_bytes=1 << 20,
        interceptors=[MetricsInterceptor(metrics)],
    )
    await running.set_serving()
    http = serve_metrics(metrics, "127.0.0.1", 0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    try:
        yield Stack(metrics, running, http, channel)
    finally:
        await channel.close()
        await running.stop(0)
        http.close()


async def _code_of(call: object) -> grpc.StatusCode:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def test_unary_calls_are_counted_with_their_final_code(stack: Stack) -> None:
    echo = stack.channel.unary_unary(f"/{SERVICE}/Echo")
    assert await echo(b"hello") == b"hello"
    assert await echo(b"again") == b"again"
    assert await _code_of(echo(b"abort")) == grpc.StatusCode.INVALID_ARGUMENT
    assert await _code_of(echo(b"missing")) == grpc.StatusCode.NOT_FOUND
    assert await _code_of(echo(b"boom")) == grpc.StatusCode.INTERNAL

    assert await stack.rpc_count("Echo", "OK") == 2
    assert await stack.rpc_count("Echo", "INVALID_ARGUMENT") == 1
    assert await stack.rpc_count("Echo", "NOT_FOUND") == 1
    assert await stack.rpc_count("Echo", "INTERNAL") == 1
    samples = await asyncio.to_thread(stack.scrape)
    ok = (("code", "OK"), ("method", "Echo"), ("service", SERVICE))
    assert samples[("ragrpc_rpc_latency_seconds_count", ok)] == 2
    assert samples[("ragrpc_rpc_latency_seconds_sum", ok)] >= 0


async def test_streaming_calls_are_counted_when_the_stream_ends(stack: Stack) -> None:
    count = stack.channel.unary_stream(f"/{SERVICE}/Count")
    assert [item async for item in count(b"go")] == [b"0", b"1", b"2"]
    received: list[bytes] = []
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        async for item in count(b"abort"):
            received.append(item)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert received == [b"0"]
    join = stack.channel.stream_unary(f"/{SERVICE}/Join")

    async def pieces() -> AsyncIterator[bytes]:
        for piece in (b"a", b"b"):
            yield piece

    assert await join(pieces()) == b"ab"

    assert await stack.rpc_count("Count", "OK") == 1
    assert await stack.rpc_count("Count", "INVALID_ARGUMENT") == 1
    assert await stack.rpc_count("Join", "OK") == 1


async def test_an_expired_deadline_is_recorded_as_deadline_exceeded(stack: Stack) -> None:
    echo = stack.channel.unary_unary(f"/{SERVICE}/Echo")
    assert await _code_of(echo(b"slow", timeout=0.2)) == grpc.StatusCode.DEADLINE_EXCEEDED
    for _ in range(50):  # the server side notices the expiry on its own schedule
        if await stack.rpc_count("Echo", "DEADLINE_EXCEEDED") == 1:
            break
        await asyncio.sleep(0.05)
    assert await stack.rpc_count("Echo", "DEADLINE_EXCEEDED") == 1


async def test_health_checks_are_not_counted(stack: Stack) -> None:
    health = health_pb2_grpc.HealthStub(stack.channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    samples = await asyncio.to_thread(stack.scrape)
    counted = [labels for name, labels in samples if name == "ragrpc_rpc_requests_total"]
    assert all(dict(labels)["service"] != "grpc.health.v1.Health" for labels in counted)


def test_each_metrics_owns_its_registry_and_exposes_every_metric() -> None:
    first, second = Metrics(), Metrics()  # the default registry would refuse the second
    first.ingest_stage.labels("embed").observe(0.3)
    first.ingest_queue_depth.set(4)
    first.chunks_written.inc(12)
    first.tokens_generated.labels("smollm2").inc(7)
    first.time_to_first_token.observe(0.4)
    first.documents.labels("ACTIVE").inc()
    text = first.exposition().decode()
    for line in (
        'ragrpc_ingest_stage_seconds_count{stage="embed"} 1.0',
        "ragrpc_ingest_queue_depth 4.0",
        "ragrpc_chunks_written_total 12.0",
        'ragrpc_tokens_generated_total{model="smollm2"} 7.0',
        "ragrpc_time_to_first_token_seconds_count 1.0",
        'ragrpc_documents_total{state="ACTIVE"} 1.0',
    ):
        assert line in text
    assert "ragrpc_chunks_written_total 0.0" in second.exposition().decode()


def test_split_method() -> None:
    assert split_method("/ragrpc.v1.RetrieveService/Ask") == ("ragrpc.v1.RetrieveService", "Ask")
    assert split_method("Ask") == ("unknown", "Ask")
