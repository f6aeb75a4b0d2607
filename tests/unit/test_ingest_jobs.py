"""Ingestion jobs share one limit of documents in flight (RAGRPC_INGEST_CONCURRENCY): a second
job starts in the slots the first one frees, and concurrent jobs never exceed the limit."""

from __future__ import annotations

import asyncio
import dataclasses

from ingest_service.app import build_components
from ingest_service.pipeline import IngestOutcome, ProgressCallback
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
    real_ingest = app.pipeline.ingest
    running: set[str] = set()
    peak = 0
    order: list[str] = []

    async def observed(item: IngestItem, progress: ProgressCallback | None = None) -> IngestOutcome:
        nonlocal peak
        running.add(item.spec.document_id)
        peak = max(peak, len(running))
        order.append(item.spec.document_id)
        try:
            await asyncio.sleep(0.01)  # long enough for every waiting document to try to start
            return await real_ingest(item, progress)
        finally:
            running.discard(item.spec.document_id)

    app.pipeline.ingest = observed  # type: ignore[method-assign]
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
