"""Optional tracing: a no-op by default, OpenTelemetry when enabled.

OpenTelemetry is imported only by `OtelTracer`, so the services neither need nor load it
unless tracing is switched on. `OtelTracer` uses the global tracer provider unless given
one: configure the SDK and exporter the standard way (for example run the service under
`opentelemetry-instrument` with OTEL_SERVICE_NAME / OTEL_EXPORTER_OTLP_ENDPOINT set).

`TracingInterceptor` opens one server span per RPC, continuing the caller's trace from the
W3C `traceparent` / `tracestate` metadata; spans opened with `tracer.span(...)` inside the
call become its children.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol

import grpc

from ragrpc.grpc_errors import rewrap_handler

AttributeValue = str | bool | int | float


class TracingUnavailableError(RuntimeError):
    """Tracing was enabled but OpenTelemetry is not installed."""


class Tracer(Protocol):
    def span(self, name: str, **attrs: AttributeValue) -> AbstractContextManager[None]:
        """A span around a block (a pipeline stage, a store call)."""
        ...

    def rpc_span(self, method: str, metadata: Mapping[str, str]) -> AbstractContextManager[None]:
        """The server span of one RPC, child of the caller's span named in `metadata`."""
        ...


class NoopTracer:
    """Records nothing; the default."""

    def span(self, name: str, **attrs: AttributeValue) -> AbstractContextManager[None]:
        return nullcontext()

    def rpc_span(self, method: str, metadata: Mapping[str, str]) -> AbstractContextManager[None]:
        return nullcontext()


class OtelTracer:
    """Spans through the OpenTelemetry API; trace context from gRPC metadata."""

    def __init__(self, tracer_provider: Any | None = None) -> None:
        try:
            from opentelemetry import propagate, trace
        except ImportError as exc:
            raise TracingUnavailableError(
                "tracing is enabled but OpenTelemetry is not installed: "
                "pip install opentelemetry-api opentelemetry-sdk (and an exporter)"
            ) from exc
        self._tracer = trace.get_tracer("ragrpc", tracer_provider=tracer_provider)
        self._extract = propagate.extract
        self._server_kind = trace.SpanKind.SERVER

    @contextmanager
    def span(self, name: str, **attrs: AttributeValue) -> Iterator[None]:
        with self._tracer.start_as_current_span(name, attributes=attrs):
            yield

    @contextmanager
    def rpc_span(self, method: str, metadata: Mapping[str, str]) -> Iterator[None]:
        service, _, name = method.lstrip("/").rpartition("/")
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}
        parent = self._extract(dict(metadata))
        with self._tracer.start_as_current_span(
            method.lstrip("/"), context=parent, kind=self._server_kind, attributes=attributes
        ):
            yield


def make_tracer(enabled: bool, tracer_provider: Any | None = None) -> Tracer:
    """NoopTracer when disabled; OtelTracer (or TracingUnavailableError) when enabled."""
    return OtelTracer(tracer_provider) if enabled else NoopTracer()


class TracingInterceptor(grpc.aio.ServerInterceptor):
    """One server span per RPC (health and reflection excluded)."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    def _metadata(self, context: grpc.aio.ServicerContext) -> dict[str, str]:
        return {k.lower(): v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}

    def _wrap_unary(self, behavior: Callable[..., Awaitable[Any]], method: str) -> Callable[..., Awaitable[Any]]:
        async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
            with self._tracer.rpc_span(method, self._metadata(context)):
                return await behavior(request, context)

        return wrapper

    def _wrap_stream(
        self, behavior: Callable[..., AsyncIterator[Any]], method: str
    ) -> Callable[..., AsyncIterator[Any]]:
        async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            with self._tracer.rpc_span(method, self._metadata(context)):
                async for item in behavior(request, context):
                    yield item

        return wrapper

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        return rewrap_handler(handler, handler_call_details.method, self._wrap_unary, self._wrap_stream)
