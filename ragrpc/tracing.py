"""Optional tracing: a no-op by default, OpenTelemetry when RAGRPC_TRACING=otel.

OpenTelemetry is imported only by `OtelTracer`, so with the default (`off`) the services
neither need nor load it. `OtelTracer` uses the global tracer provider unless given one:
configure the SDK and exporter the standard way (for example run the service under
`opentelemetry-instrument` with OTEL_SERVICE_NAME / OTEL_EXPORTER_OTLP_ENDPOINT set).
Install the `tracing` extra (opentelemetry-api, -sdk, -instrumentation-grpc).

Spans of one call:

    /ragrpc.v1.RetrieveService/Ask          SERVER, the RPC span (caller's traceparent continued)
    ├── embed_query  ├── dense  ├── sparse  ├── fuse  ├── rerank      INTERNAL, stage spans
    └── context  └── generate
    /ragrpc.v1.IngestService/...            SERVER
    └── extract, chunk, embed, write        (the ingest pipeline's stages)

Stage names (every stage span is a direct child of the RPC span):

    query:  embed_query, dense, sparse, fuse, rerank, context, generate
    ingest: extract (size, media type, blocks, characters), chunk (strategy, chunker, chunks),
            embed (model, chunks, batches; the chunk writes overlap it), write (the registry
            switch to the new version and removal of the one it replaced)

The RPC span comes from the maintained OpenTelemetry gRPC instrumentation
(opentelemetry-instrumentation-grpc, `aio_server_interceptor`), not a hand-written
interceptor: it supports grpc.aio servers, unary and streaming RPCs (the span stays open
until the response stream ends), continues the caller's trace from W3C `traceparent` /
`tracestate` metadata (through the global propagator), sets the semantic-convention
attributes (rpc.system, rpc.service, rpc.method, rpc.grpc.status_code, net.peer.*) and
works with the installed grpcio (it requires grpcio >= 1.42). `server_interceptor()` gives
it with health and reflection excluded; `ragrpc.server.build_server` puts it outermost,
before the error mapping, so the status code the mapping aborts with lands on the span
(codes that are not server errors by the conventions, such as INVALID_ARGUMENT, leave the
span status unset). When the process already instruments grpc.aio servers globally
(`opentelemetry-instrument` loads GrpcAioInstrumentorServer), that interceptor is used and
none is added, so there is one RPC span; exclude health there with
OTEL_PYTHON_GRPC_EXCLUDED_SERVICES=grpc.health.v1.Health.

Stage spans: `tracer.span(name, **attrs)` is a context manager yielding a handle whose
`set(**attrs)` adds attributes once the work is done (counts of what came out) and
`event(name, **attrs)` records a point event (a generator that failed). A keyword `k`
becomes the attribute `ragrpc.<span name>.<k>`; a dotted name, passed as
`**{"gen_ai.usage.input_tokens": n}`, is kept as it is (OpenTelemetry semantic conventions:
gen_ai.*, server.address). None values are left out. Event attributes are kept as given.
An exception leaving the block is recorded on the span and sets its status to ERROR.
NoopTracer returns one shared do-nothing handle: no allocation per span.

Parents: the current span lives in contextvars. Tasks (asyncio.gather, create_task) copy
them; async generators share their consumer's; executor threads do not: work that opens
spans (or calls instrumented clients) in `loop.run_in_executor` must run through
`in_current_context(fn)` (asyncio.to_thread copies them itself). Open a stage's span in
the coroutine around the executor call when the thread itself records nothing. Work that
outlives its RPC (an ingestion job that goes on after its caller left) may keep the RPC
span as parent: a child may end after its parent.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ragrpc import errors

if TYPE_CHECKING:
    import grpc

AttributeValue = str | bool | int | float | Sequence[str] | Sequence[int] | Sequence[float] | None
T = TypeVar("T")

QUERY_STAGES = ("embed_query", "dense", "sparse", "fuse", "rerank", "context", "generate")
INGEST_STAGES = ("extract", "chunk", "embed", "write")
TRACING_MODES = ("off", "otel")


class TracingUnavailableError(errors.PreconditionError):
    """Tracing was enabled but OpenTelemetry (or its gRPC instrumentation) is not installed."""

    default_reason = "TRACING_UNAVAILABLE"


class SpanHandle(Protocol):
    def set(self, **attrs: AttributeValue) -> None:
        """Adds attributes to the span (same naming rule as Tracer.span)."""
        ...

    def event(self, name: str, **attrs: AttributeValue) -> None:
        """Records a point event on the span; its attributes are kept as given."""
        ...


class Tracer(Protocol):
    def span(self, name: str, **attrs: AttributeValue) -> AbstractContextManager[SpanHandle]:
        """A span around a block (a pipeline stage), child of the current span."""
        ...

    def server_interceptor(self) -> grpc.aio.ServerInterceptor | None:
        """The interceptor that opens the RPC spans; None when nothing needs adding."""
        ...


class _NoopSpan:
    __slots__ = ()

    def __enter__(self) -> _NoopSpan:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def set(self, **attrs: AttributeValue) -> None:
        return None

    def event(self, name: str, **attrs: AttributeValue) -> None:
        return None


_NOOP_SPAN = _NoopSpan()


class NoopTracer:
    """Records nothing; the default."""

    def span(self, name: str, **attrs: AttributeValue) -> AbstractContextManager[SpanHandle]:
        return _NOOP_SPAN

    def server_interceptor(self) -> grpc.aio.ServerInterceptor | None:
        return None


def _attributes(prefix: str, attrs: dict[str, AttributeValue]) -> dict[str, Any]:
    return {(key if "." in key else prefix + key): value for key, value in attrs.items() if value is not None}


class _OtelSpan:
    __slots__ = ("_prefix", "_span")

    def __init__(self, span: Any, prefix: str) -> None:
        self._span = span
        self._prefix = prefix

    def set(self, **attrs: AttributeValue) -> None:
        self._span.set_attributes(_attributes(self._prefix, attrs))

    def event(self, name: str, **attrs: AttributeValue) -> None:
        self._span.add_event(name, {key: value for key, value in attrs.items() if value is not None})


class OtelTracer:
    """Spans through the OpenTelemetry API (the global tracer provider unless given one)."""

    def __init__(self, tracer_provider: Any | None = None) -> None:
        try:
            from opentelemetry import trace
        except ImportError as exc:
            raise TracingUnavailableError(
                "RAGRPC_TRACING=otel but OpenTelemetry is not installed: pip install 'ragrpc[tracing]' "
                "(opentelemetry-api, opentelemetry-sdk, opentelemetry-instrumentation-grpc) and an exporter"
            ) from exc
        self._provider = tracer_provider
        self._tracer = trace.get_tracer("ragrpc", tracer_provider=tracer_provider)

    @contextmanager
    def span(self, name: str, **attrs: AttributeValue) -> Iterator[SpanHandle]:
        prefix = f"ragrpc.{name}."
        with self._tracer.start_as_current_span(name, attributes=_attributes(prefix, attrs)) as span:
            yield _OtelSpan(span, prefix)

    def server_interceptor(self) -> grpc.aio.ServerInterceptor | None:
        try:
            from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorServer, aio_server_interceptor, filters
        except ImportError as exc:
            raise TracingUnavailableError(
                "RAGRPC_TRACING=otel but opentelemetry-instrumentation-grpc is not installed: "
                "pip install 'ragrpc[tracing]'"
            ) from exc
        # The instrumentor is a singleton; read its state without constructing it (its __init__ resets its filter).
        instrumentor = GrpcAioInstrumentorServer._instance
        if instrumentor is not None and instrumentor.is_instrumented_by_opentelemetry:
            return None  # grpc.aio.server is patched to add the same interceptor first
        internal = filters.any_of(filters.health_check(), filters.service_prefix("grpc.reflection"))
        return aio_server_interceptor(tracer_provider=self._provider, filter_=filters.negate(internal))


def make_tracer(enabled: bool, tracer_provider: Any | None = None) -> Tracer:
    """NoopTracer when disabled; OtelTracer (or TracingUnavailableError) when enabled."""
    return OtelTracer(tracer_provider) if enabled else NoopTracer()


def tracer_from_setting(mode: str, tracer_provider: Any | None = None) -> Tracer:
    """The tracer for RAGRPC_TRACING: `off` (or empty) or `otel`; ValueError otherwise."""
    value = (mode or "off").strip().lower()
    if value not in TRACING_MODES:
        raise ValueError(f"RAGRPC_TRACING must be one of {', '.join(TRACING_MODES)}, not {mode!r}")
    return make_tracer(value == "otel", tracer_provider)


def in_current_context(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn` bound to a copy of the caller's contextvars (the current span), for executor threads."""
    return functools.partial(contextvars.copy_context().run, fn)
