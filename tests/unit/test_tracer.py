"""The tracer itself, without a service: span handles name their attributes after the stage and
record events and errors; the no-op tracer shares one handle; the setting picks the tracer; and the
default configuration imports no OpenTelemetry at all (checked in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ragrpc.tracing import NoopTracer, OtelTracer, tracer_from_setting


def _attrs(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_span_handle_naming_and_events(tracer: OtelTracer, exporter: InMemorySpanExporter) -> None:
    with tracer.span("chunk", strategy="sentence", skipped=None, **{"gen_ai.request.model": "m"}) as span:
        span.set(chunks=7, tokens=[3, 4])
        span.event("oversized", chunk=2)
    with pytest.raises(ValueError), tracer.span("write"):
        raise ValueError("store down")
    chunk, write = exporter.get_finished_spans()
    assert dict(_attrs(chunk)) == {
        "ragrpc.chunk.strategy": "sentence",
        "gen_ai.request.model": "m",
        "ragrpc.chunk.chunks": 7,
        "ragrpc.chunk.tokens": (3, 4),
    }
    assert [(e.name, dict(_attrs(e))) for e in chunk.events] == [("oversized", {"chunk": 2})]
    assert write.status.status_code == trace.StatusCode.ERROR


def test_noop_tracer_and_the_setting() -> None:
    noop = NoopTracer()
    with noop.span("embed", texts=3) as first, noop.span("write") as second:
        first.set(vectors=3)
        first.event("retry", attempt=1)
    assert first is second  # one shared handle
    assert noop.server_interceptor() is None
    assert isinstance(tracer_from_setting("off"), NoopTracer) and isinstance(tracer_from_setting(""), NoopTracer)
    assert isinstance(tracer_from_setting("OTEL"), OtelTracer)
    with pytest.raises(ValueError, match="RAGRPC_TRACING"):
        tracer_from_setting("jaeger")


def test_default_imports_no_opentelemetry() -> None:
    code = (
        "import sys, dataclasses\n"
        "from query_service.app import build_components\n"
        "from ragrpc.server import host_service\n"
        "from ragrpc.config import Settings\n"
        "from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry\n"
        "from ragrpc.tracing import NoopTracer\n"
        "settings = dataclasses.replace(Settings(), sparse_backend='none')\n"
        "c = build_components(settings, HashingEmbedder(), InMemoryChunkStore(), InMemoryDocumentRegistry())\n"
        "assert isinstance(c.tracer, NoopTracer)\n"
        "c.executor.shutdown()\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
