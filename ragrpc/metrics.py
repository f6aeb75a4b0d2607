"""Prometheus metrics of both services, on a registry each `Metrics` owns.

`MetricsInterceptor` counts every RPC (unary and streaming) with its final status code and
latency; health and reflection calls are not counted. The pipelines know nothing of metrics:
they report events to an observer, and `IngestMetricsObserver` / `AnswerMetricsObserver` turn
those events into the named measurements (`ingest_stage_seconds`, `chunks_written`, ...).
`serve_metrics` exposes the registry over HTTP for Prometheus to scrape.

Metric names carry the `ragrpc_` namespace: `ragrpc_rpc_requests_total{service,method,code}`,
`ragrpc_rpc_latency_seconds{service,method,code}`, `ragrpc_ingest_stage_seconds{stage}`,
`ragrpc_ingest_queue_depth`, `ragrpc_chunks_written_total`, `ragrpc_tokens_generated_total{model}`,
`ragrpc_time_to_first_token_seconds`, `ragrpc_documents_total{state}`,
`ragrpc_background_failures_total{task}`, `ragrpc_rerank_failures_total{cause}` (remote rerank calls that
failed: the request kept the fused order).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from threading import Lock, Thread
from typing import Any
from wsgiref.simple_server import WSGIServer

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server

from ragrpc import errors
from ragrpc.grpc_errors import rewrap_handler, status_code_for

# Streaming RPCs (Ask, IngestDocuments) run for seconds to minutes, so the buckets go far.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """Every metric of a service, registered on its own `CollectorRegistry` (never the
    process-wide default one), so tests and several servers in one process do not collide."""

    def __init__(self, namespace: str = "ragrpc") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        common: dict[str, Any] = {"namespace": namespace, "registry": self.registry}
        rpc_labels = ("service", "method", "code")
        self.rpc_requests = Counter("rpc_requests", "RPCs finished, by final status code", rpc_labels, **common)
        self.rpc_latency = Histogram(
            "rpc_latency_seconds",
            "RPC duration, first byte in to status out",
            rpc_labels,
            buckets=LATENCY_BUCKETS,
            **common,
        )
        self.ingest_stage = Histogram(
            "ingest_stage_seconds",
            "Duration of one ingestion stage of a document",
            ("stage",),
            buckets=LATENCY_BUCKETS,
            **common,
        )
        self.ingest_queue_depth = Gauge("ingest_queue_depth", "Documents waiting to be ingested", **common)
        self.enricher_failures = Counter(
            "enricher_failures",
            "Calls of an enricher that failed (its contribution left out; the document ingested, the question asked)",
            ("enricher",),
            **common,
        )
        self.index_lagging_documents = Gauge(
            "index_lagging_documents",
            "Query service: registry changes its in-process indexes could not apply yet (the previous versions "
            "stay visible; retried every poll)",
            **common,
        )
        self.chunks_written = Counter("chunks_written", "Chunks written to the store", **common)
        self.tokens_generated = Counter("tokens_generated", "Answer tokens streamed, by model", ("model",), **common)
        self.time_to_first_token = Histogram(
            "time_to_first_token_seconds", "From Ask received to its first answer token", buckets=TTFT_BUCKETS, **common
        )
        self.documents = Counter("documents", "Documents that reached a final state, by state", ("state",), **common)
        self.background_failures = Counter(
            "background_failures", "Failed steps of a supervised background task (retried)", ("task",), **common
        )
        self.rerank_failures = Counter(
            "rerank_failures",
            "Remote rerank calls that failed, by cause (the request kept the fused order)",
            ("cause",),
            **common,
        )

    def observe_rpc(self, full_method: str, code: grpc.StatusCode, seconds: float) -> None:
        service, method = split_method(full_method)
        labels = (service, method, code.name)
        self.rpc_requests.labels(*labels).inc()
        self.rpc_latency.labels(*labels).observe(seconds)

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)


class IngestMetricsObserver:
    """Receives every ProgressEvent of the ingest pipeline: times each stage of each document,
    counts final states and written chunks."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._current: dict[str, tuple[str, float]] = {}  # document id -> (stage, started)
        self._lock = Lock()
        # the labelled children, looked up once (`labels()` validates and locks on every call, and
        # this runs for every event of every document)
        self._stage_seconds: dict[str, Any] = {}
        self._documents: dict[str, Any] = {}

    def __call__(self, event: Any) -> None:
        now = time.perf_counter()
        with self._lock:
            previous = self._current.get(event.document_id)
            if previous is not None and previous[0] != event.stage:
                _labelled(self._stage_seconds, self._metrics.ingest_stage, previous[0]).observe(now - previous[1])
            if event.stage == "done":
                self._current.pop(event.document_id, None)
            elif previous is None or previous[0] != event.stage:
                self._current[event.document_id] = (event.stage, now)
        if event.stage == "done":
            _labelled(self._documents, self._metrics.documents, event.state.name).inc()
            if event.state.name == "ACTIVE" and not event.unchanged:
                self._metrics.chunks_written.inc(event.chunks_embedded)


def _labelled(children: dict[str, Any], metric: Any, value: str) -> Any:
    """`metric.labels(value)`, kept in `children` after its first use."""
    child = children.get(value)
    if child is None:
        child = children[value] = metric.labels(value)
    return child


class AnswerMetricsObserver:
    """Receives each finished answer: tokens generated per model and time to first token."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def __call__(self, finished: Any) -> None:
        self._metrics.tokens_generated.labels(finished.model).inc(finished.completion_tokens)
        ttft = dict(finished.timings).get("time_to_first_token")
        if ttft is not None:
            self._metrics.time_to_first_token.observe(ttft / 1000.0)


def split_method(full_method: str) -> tuple[str, str]:
    """ "/ragrpc.v1.RetrieveService/Ask" -> ("ragrpc.v1.RetrieveService", "Ask")."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    return service or "unknown", method


def _code_of(exc: BaseException, context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    """The status code the client will see for a behavior that raised `exc`."""
    if isinstance(exc, grpc.aio.AbortError):
        return _context_code(context) or grpc.StatusCode.UNKNOWN
    if isinstance(exc, errors.RagrpcError):  # mapped further out by ErrorMappingInterceptor
        return status_code_for(exc)
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        remaining = context.time_remaining()
        expired = remaining is not None and remaining <= 0
        return grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED
    return grpc.StatusCode.INTERNAL  # what ErrorMappingInterceptor turns any other exception into


def _context_code(context: grpc.aio.ServicerContext) -> grpc.StatusCode | None:
    code = context.code()
    if code is None or isinstance(code, grpc.StatusCode):
        return code
    return next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    """Records count and latency of every RPC with its final status code."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def _wrap_unary(self, behavior: Callable[..., Awaitable[Any]], method: str) -> Callable[..., Awaitable[Any]]:
        async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
            start = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                result = await behavior(request, context)
                code = _context_code(context) or grpc.StatusCode.OK
                return result
            except BaseException as exc:
                code = _code_of(exc, context)
                raise
            finally:
                self._metrics.observe_rpc(method, code, time.perf_counter() - start)

        return wrapper

    def _wrap_stream(
        self, behavior: Callable[..., AsyncIterator[Any]], method: str
    ) -> Callable[..., AsyncIterator[Any]]:
        async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            start = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                async for item in behavior(request, context):
                    yield item
                code = _context_code(context) or grpc.StatusCode.OK
            except BaseException as exc:
                code = _code_of(exc, context)
                raise
            finally:
                self._metrics.observe_rpc(method, code, time.perf_counter() - start)

        return wrapper

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        return rewrap_handler(handler, handler_call_details.method, self._wrap_unary, self._wrap_stream)


@dataclass
class MetricsHttpServer:
    """A running /metrics endpoint (any path answers with the exposition)."""

    port: int
    _httpd: WSGIServer
    _thread: Thread

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def serve_metrics(metrics: Metrics, host: str, port: int) -> MetricsHttpServer:
    """Serves the registry over HTTP from a daemon thread; port 0 picks a free port."""
    httpd, thread = start_http_server(port, addr=host, registry=metrics.registry)
    return MetricsHttpServer(port=int(httpd.server_port), _httpd=httpd, _thread=thread)


def start_metrics_http_server(metrics: Metrics, host: str, port: int) -> int:
    """Starts the /metrics endpoint for the life of the process; returns the bound port."""
    return serve_metrics(metrics, host, port).port
