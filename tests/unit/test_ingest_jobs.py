"""Ingestion jobs share one limit of documents in flight (RAGRPC_INGEST_CONCURRENCY): a second
job starts in the slots the first one frees, and concurrent jobs never exceed the limit."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from ingest_service.app import build_components
from ingest_service.jobs import IngestJobRunner, JobEvent, JobSummary, latest_per_document
from ingest_service.pipeline import IngestOutcome, ProgressEvent
from ingest_service.requests import DocumentSpecInput, IngestItem
from ragrpc.config import Settings
from ragrpc.models import DocumentState
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry


def _item(number: int) -> IngestItem:
    text = f"Document {number} is about ducks, geese and swans number {number}.".encode()
    return IngestItem("t1", DocumentSpecInput(document_id=f"d{number}", file_name=f"d{number}.txt"), text)


async def test_concurrent_jobs_share_the_documents_in_flight_limit() -> None:
    chunks, registry = InMemoryChunkStore(), InMemoryDocumentRegistry()
    settings = dataclasses.replace(Settings(), workers=2, ingest_concurrency=3)
    app = build_components(settings, HashingEmbedder(), chunks, registry)
    real_ingest = app.pipeline._ingest_locked  # what runs once a document has its slot
    running: set[str] = set()
    peak = 0
    order: list[str] = []

    async def observed(item: IngestItem, *args: Any) -> IngestOutcome:
        nonlocal peak
        running.add(item.spec.document_id)
        peak = max(peak, len(running))
        order.append(item.spec.document_id)
        try:
            await asyncio.sleep(0.01)  # long enough for every waiting document to try to start
            return await real_ingest(item, *args)
        finally:
            running.discard(item.spec.document_id)

    app.pipeline._ingest_locked = observed  # type: ignore[method-assign]
    first_id, first = await app.jobs.start("t1", [_item(n) for n in range(5)])
    second_id, second = await app.jobs.start("t1", [_item(n) for n in range(5, 10)])

    async def summary(events):  # type: ignore[no-untyped-def]
        return [e.summary async for e in events if e.summary is not None][-1]

    done = await asyncio.gather(summary(first), summary(second))
    assert [s.succeeded for s in done] == [5, 5]
    assert peak == 3, f"{peak} documents ran at once; the limit is 3 across both jobs"
    # First come, first served: the first job's documents all started before the second job's.
    assert order[:5] == [f"d{n}" for n in range(5)]
    for job_id in (first_id, second_id):
        assert (await app.jobs.get("t1", job_id)).done
    for number in range(10):
        record = registry.get("t1", f"d{number}")
        assert record is not None and record.state == DocumentState.ACTIVE


def test_queued_progress_of_a_document_leaves_as_its_latest_event() -> None:
    def progress(index: int, stage: str, embedded: int = 0) -> JobEvent:
        event = ProgressEvent(f"d{index}", stage, DocumentState.PROCESSING, 4, embedded)
        return JobEvent("j", index=index, progress=event)

    events: list[object] = [
        progress(0, "queued"),
        progress(1, "queued"),
        progress(0, "extracting"),
        progress(1, "embedding", 2),
        progress(0, "done"),
        JobEvent("j", summary=JobSummary(succeeded=2)),
    ]
    kept = latest_per_document(events)
    assert [(e.index, e.progress.stage if e.progress else "summary") for e in kept] == [  # type: ignore[union-attr]
        (1, "embedding"),
        (0, "done"),
        (-1, "summary"),
    ]
    assert latest_per_document([events[0]]) == [events[0]]


async def test_a_stream_read_late_still_gets_every_documents_final_event() -> None:
    """The caller reads the stream only after the job ended: each document's events were merged
    into its final one, and nothing a caller needs (outcome per document, summary) is lost."""
    settings = dataclasses.replace(Settings(), workers=2, ingest_concurrency=4)
    app = build_components(settings, HashingEmbedder(), InMemoryChunkStore(), InMemoryDocumentRegistry())
    job_id, events = await app.jobs.start("t1", [_item(n) for n in range(6)])
    await app.jobs.drain(30)
    received = [e async for e in events]
    progress = [e for e in received if e.progress is not None]
    assert sorted(e.index for e in progress) == list(range(6))  # one event per document
    assert {e.progress.stage for e in progress} == {"done"}  # type: ignore[union-attr]
    assert received[-1].summary is not None and received[-1].summary.succeeded == 6
    job = await app.jobs.get("t1", job_id)
    assert [d["stage"] for d in job.documents] == ["done"] * 6
    assert job.documents[0] == {
        "index": 0,
        "document_id": "d0",
        "stage": "done",
        "state": int(DocumentState.ACTIVE),
        "chunk_count": 1,
        "chunks_embedded": 1,
        "error": "",
        "error_code": "",
        "unchanged": False,
        "error_reason": "",
        "error_metadata": {},
    }


async def test_a_stream_gathers_a_documents_events_for_its_interval_and_sends_the_summary_at_once() -> None:
    """Events that arrive within the stream's interval after the first of a send leave as each
    document's latest one (a small document sends one message instead of six), and the summary
    does not wait for an interval of its own."""
    settings = dataclasses.replace(Settings(), workers=2, ingest_concurrency=4)
    registry = InMemoryDocumentRegistry()
    app = build_components(settings, HashingEmbedder(), InMemoryChunkStore(), registry)
    # an interval far longer than these six in-memory ingestions take
    jobs = IngestJobRunner(app.ingestions, registry, app.executor, app.gate, stream_interval_s=1.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    _, events = await jobs.start("t1", [_item(n) for n in range(6)])
    received = [(e, loop.time() - started) async for e in events]
    progress = [e for e, _ in received if e.progress is not None]
    assert sorted(e.index for e in progress) == list(range(6))  # one message per document
    assert {e.progress.stage for e in progress} == {"done"}  # type: ignore[union-attr]
    summary, at = received[-1]
    assert summary.summary is not None and summary.summary.succeeded == 6
    assert at < 1.9, f"the summary came {at:.2f}s after the start; one interval is 1s"


async def test_with_no_stream_interval_events_leave_as_they_are_read() -> None:
    settings = dataclasses.replace(Settings(), workers=2, ingest_concurrency=1)
    registry = InMemoryDocumentRegistry()
    app = build_components(settings, HashingEmbedder(), InMemoryChunkStore(), registry)
    jobs = IngestJobRunner(app.ingestions, registry, app.executor, app.gate, stream_interval_s=0.0)
    _, events = await jobs.start("t1", [_item(0)])
    stages = [e.progress.stage async for e in events if e.progress is not None]
    assert stages[-1] == "done" and len(stages) > 1, stages  # read as they came: more than the final one


async def test_a_final_only_stream_carries_each_documents_done_event_and_the_record_every_stage() -> None:
    """final_only (PROGRESS_DETAIL_FINAL): with events read as they come, the stream still carries one
    event per document, its final one (a failed document's too), then the summary; the job's record
    follows the stages as ever."""
    settings = dataclasses.replace(Settings(), workers=2, ingest_concurrency=1)
    registry = InMemoryDocumentRegistry()
    app = build_components(settings, HashingEmbedder(), InMemoryChunkStore(), registry)
    jobs = IngestJobRunner(app.ingestions, registry, app.executor, app.gate, stream_interval_s=0.0)
    empty = IngestItem("t1", DocumentSpecInput(document_id="blank", file_name="blank.txt"), b"   \n  ")
    seen_stages: list[str] = []
    job_id, events = await jobs.start("t1", [_item(0), empty, _item(2)], final_only=True)
    received = []
    async for event in events:
        received.append(event)
        job = await jobs.get("t1", job_id)
        seen_stages += [d["stage"] for d in job.documents]
    progress = [e for e in received if e.progress is not None]
    assert [e.index for e in progress] == [0, 1, 2]  # one event per document (one slot: in order)
    assert [e.progress.stage for e in progress] == ["done"] * 3  # type: ignore[union-attr]
    assert [e.progress.state for e in progress] == [  # type: ignore[union-attr]
        DocumentState.ACTIVE,
        DocumentState.FAILED,
        DocumentState.ACTIVE,
    ]
    assert progress[1].progress.error_code == "INVALID_ARGUMENT"  # type: ignore[union-attr]
    assert received[-1].summary is not None and (received[-1].summary.succeeded, received[-1].summary.failed) == (2, 1)
    assert len(received) == 4
    final = await jobs.get("t1", job_id)
    assert [d["stage"] for d in final.documents] == ["done"] * 3


async def test_a_caller_that_stops_reading_while_its_stream_gathers_leaves_the_job_running() -> None:
    """Cancelling the reader during the stream's interval (the await the gathering adds) ends only
    the stream: the job ingests every document and records its end."""
    settings = dataclasses.replace(Settings(), workers=2, ingest_concurrency=2)
    registry = InMemoryDocumentRegistry()
    app = build_components(settings, HashingEmbedder(), InMemoryChunkStore(), registry)
    jobs = IngestJobRunner(app.ingestions, registry, app.executor, app.gate, stream_interval_s=5.0)
    job_id, events = await jobs.start("t1", [_item(n) for n in range(4)])

    async def read() -> list[JobEvent]:
        return [e async for e in events]

    reader = asyncio.ensure_future(read())
    await asyncio.sleep(0.3)  # the first event arrived; the stream is gathering for 5 s
    assert not reader.done()
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    await jobs.drain(30)
    job = await jobs.get("t1", job_id)
    assert job.done and job.summary is not None and job.summary["succeeded"] == 4
    for number in range(4):
        record = registry.get("t1", f"d{number}")
        assert record is not None and record.state == DocumentState.ACTIVE
