"""Turns pipeline events into Prometheus measurements (the pipelines know nothing of metrics)."""

from __future__ import annotations

import threading
import time
from typing import Any

from ragrpc.metrics import Metrics


class IngestMetricsObserver:
    """Receives every ProgressEvent of the ingest pipeline: times each stage of each document,
    counts final states and written chunks."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._current: dict[str, tuple[str, float]] = {}  # document id -> (stage, started)
        self._lock = threading.Lock()

    def __call__(self, event: Any) -> None:
        now = time.perf_counter()
        with self._lock:
            previous = self._current.get(event.document_id)
            if previous is not None and previous[0] != event.stage:
                self._metrics.ingest_stage.labels(previous[0]).observe(now - previous[1])
            if event.stage == "done":
                self._current.pop(event.document_id, None)
            elif previous is None or previous[0] != event.stage:
                self._current[event.document_id] = (event.stage, now)
        if event.stage == "done":
            self._metrics.documents.labels(event.state.name).inc()
            if event.state.name == "ACTIVE" and not event.unchanged:
                self._metrics.chunks_written.inc(event.chunks_embedded)


class AnswerMetricsObserver:
    """Receives each finished answer: tokens generated per model and time to first token."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def __call__(self, finished: Any) -> None:
        self._metrics.tokens_generated.labels(finished.model).inc(finished.completion_tokens)
        ttft = dict(finished.timings).get("time_to_first_token")
        if ttft is not None:
            self._metrics.time_to_first_token.observe(ttft / 1000.0)
