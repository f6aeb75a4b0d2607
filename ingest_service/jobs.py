"""Ingestion jobs: a batch of documents processed by a background task.

The task belongs to the service, not to the call: a caller that disconnects only stops
listening. Each document is an ingestion of its own (`Ingestions`), sharing the service's
document slots with uploads. Progress is kept in the job record, persisted in the store after every
finished document, so GetIngestJob answers from any replica and after a restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import Executor
from dataclasses import asdict, dataclass

from ingest_service.admission import AdmissionGate, Reservation
from ingest_service.ingestions import Ingestions
from ingest_service.pipeline import ProgressEvent
from ingest_service.requests import IngestItem
from ragrpc import errors
from ragrpc.consistency import ConsistencyToken
from ragrpc.models import DocumentRecord, DocumentState, IngestJobRecord
from ragrpc.store.base import DocumentRegistry

logger = logging.getLogger(__name__)

_END = object()

# How long a job's stream gathers events before it sends them: a document's events within it leave as
# its latest one (`latest_per_document`). Each stream message costs the event loop a gRPC write (about
# 74 µs of the service's CPU, docs/benchmarks.md), and a small document passes its six stages in well
# under this, so at the service's ceiling a document sent about 3.9 messages without it.
STREAM_INTERVAL_S = 0.1


@dataclass
class JobSummary:
    succeeded: int = 0
    failed: int = 0
    unchanged: int = 0
    chunks_written: int = 0
    elapsed_seconds: float = 0.0
    consistency_token: str = ""  # read your writes: the documents the batch stored (ragrpc.consistency)


@dataclass
class JobEvent:
    """One event of a job stream: progress of document `index`, or the final summary."""

    job_id: str
    index: int = -1
    progress: ProgressEvent | None = None
    summary: JobSummary | None = None


class IngestJobRunner:
    """Starts jobs and lets callers follow them."""

    def __init__(
        self,
        ingestions: Ingestions,
        registry: DocumentRegistry,
        executor: Executor,
        gate: AdmissionGate,
        progress_interval_s: float = 1.0,
        stream_interval_s: float = STREAM_INTERVAL_S,
    ) -> None:
        """progress_interval_s: how often a running job's record is persisted; stream_interval_s: how
        long a job's stream gathers events before sending them (0: it sends what is queued at once)."""
        self._stream_interval_s = stream_interval_s
        self._ingestions = ingestions
        self._progress_interval_s = progress_interval_s
        self._persisted_at: dict[str, float] = {}
        self._gate = gate
        self._registry = registry
        self._executor = executor
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(
        self, tenant: str, items: list[IngestItem], *, final_only: bool = False
    ) -> tuple[str, AsyncIterator[JobEvent]]:
        """Starts a job; returns its id and an iterator of its events (ending after the summary);
        final_only: of each document, only its final progress event (stage `done`), the job's record
        still following every stage. Raises LimitExceededError when the service already has too many
        documents queued."""
        reservation = self._gate.reserve(len(items))
        try:
            job_id, events = await self._start(tenant, items, reservation, final_only)
        except BaseException:  # incl. a caller cancelled while the job record is written
            reservation.release_all()
            raise
        return job_id, events

    async def _start(
        self, tenant: str, items: list[IngestItem], reservation: Reservation, final_only: bool
    ) -> tuple[str, AsyncIterator[JobEvent]]:
        job = IngestJobRecord(
            job_id=uuid.uuid4().hex,
            tenant=tenant,
            created_at=time.time(),
            documents=[
                {"index": i, "document_id": it.spec.document_id, "stage": "queued", "state": int(DocumentState.PENDING)}
                for i, it in enumerate(items)
            ],
        )
        await self._persist(job)
        self._persisted_at[job.job_id] = time.monotonic()
        queue: asyncio.Queue[object] = asyncio.Queue()
        task = asyncio.create_task(self._run(job, items, reservation, queue))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job.job_id, self._follow(queue, final_only)

    async def _follow(self, queue: asyncio.Queue[object], final_only: bool) -> AsyncIterator[JobEvent]:
        """The job's events; a document's events that queued up while the caller was not reading, or
        within stream_interval_s of the first event of a send, leave as its latest one (see
        `latest_per_document`). The summary is sent at once. final_only: of each document's progress,
        its final event only (stage `done`)."""

        def wanted(event: object) -> bool:
            if not final_only or not isinstance(event, JobEvent) or event.progress is None:
                return True  # the summary, the end, or every progress event
            return event.progress.stage == "done"

        while True:
            first = await queue.get()
            if not wanted(first):
                continue
            waiting = [first]
            if self._stream_interval_s > 0 and isinstance(first, JobEvent) and first.summary is None:
                await asyncio.sleep(self._stream_interval_s)
            while not queue.empty():
                event = queue.get_nowait()
                if wanted(event):
                    waiting.append(event)
            for event in latest_per_document(waiting):
                if event is _END:
                    return
                assert isinstance(event, JobEvent)
                yield event

    async def _run(
        self, job: IngestJobRecord, items: list[IngestItem], reservation: Reservation, queue: asyncio.Queue[object]
    ) -> None:
        started = time.monotonic()
        summary = JobSummary()
        stored: list[tuple[str, DocumentRecord | None]] = []
        try:
            await asyncio.gather(
                *(self._ingest_one(job, i, it, reservation, summary, queue, stored) for i, it in enumerate(items))
            )
        finally:
            reservation.release_all()  # documents never submitted (the job was cancelled at shutdown)
            summary.elapsed_seconds = time.monotonic() - started
            summary.consistency_token = ConsistencyToken.of_write(time.time(), stored).encode()
            job.done = True
            job.summary = asdict(summary)
            self._persisted_at.pop(job.job_id, None)
            await self._persist(job)
            queue.put_nowait(JobEvent(job.job_id, summary=summary))
            queue.put_nowait(_END)

    async def _ingest_one(
        self,
        job: IngestJobRecord,
        index: int,
        item: IngestItem,
        reservation: Reservation,
        summary: JobSummary,
        queue: asyncio.Queue[object],
        stored: list[tuple[str, DocumentRecord | None]],
    ) -> None:
        def report(event: ProgressEvent) -> None:
            job.documents[index] = progress_row(index, event)
            queue.put_nowait(JobEvent(job.job_id, index=index, progress=event))

        try:
            outcome = await asyncio.shield(self._ingestions.submit(item, reservation, report))
        except errors.RagrpcError as exc:
            summary.failed += 1
            if job.documents[index].get("stage") != "done":  # failed before the pipeline reported it
                report(ProgressEvent.failed(item.spec.document_id, exc))
        else:
            stored.append((outcome.record.key, outcome.record))
            summary.succeeded += 1
            summary.unchanged += int(outcome.unchanged)
            summary.chunks_written += outcome.chunks_written
        await self._persist_progress(job)

    async def _persist_progress(self, job: IngestJobRecord) -> None:
        """Progress of a running job is written at most once per progress_interval_s: each write
        rewrites the whole job row and shares the single writer with the chunks. The start and the
        end of a job are always written (GetIngestJob may lag the live stream by that interval)."""
        now = time.monotonic()
        if now - self._persisted_at.get(job.job_id, 0.0) < self._progress_interval_s:
            return
        self._persisted_at[job.job_id] = now
        await self._persist(job)

    async def _persist(self, job: IngestJobRecord) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._registry.put_job, job)
        except errors.RagrpcError as exc:
            logger.warning("could not persist job %s: %s", job.job_id, exc.message)

    async def get(self, tenant: str, job_id: str) -> IngestJobRecord:
        if not job_id:
            raise errors.InvalidInputError("job_id is required", field="job_id")
        job = await asyncio.get_running_loop().run_in_executor(self._executor, self._registry.get_job, job_id)
        if job is None or job.tenant != tenant:
            raise errors.NotFoundError(f"ingest job {job_id!r} does not exist")
        return job

    async def drain(self, timeout_s: float) -> None:
        """Waits (up to timeout_s) for running jobs, at shutdown."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)


def progress_row(index: int, event: ProgressEvent) -> dict[str, object]:
    """The job record's entry for a document: the event's fields, state as a number (a shallow
    copy, not dataclasses.asdict's deep one: this runs for every progress event)."""
    return {"index": index, **vars(event), "state": int(event.state)}


def latest_per_document(events: list[object]) -> list[object]:
    """Of events read from a job's queue at once, each document's latest progress event, in the
    order of those latest events, with the other events (summary, end) where they were.

    Progress events report where a document is now, so an earlier one that has not left yet adds
    nothing once a later one exists; a document's final event (stage `done`) is its last, so it is
    always kept. Small documents pass several stages between two reads of the stream, and each
    message costs the event loop a gRPC write, so under load this sends fewer messages."""
    last = {e.index: i for i, e in enumerate(events) if isinstance(e, JobEvent) and e.progress is not None}
    return [
        e
        for i, e in enumerate(events)
        if not (isinstance(e, JobEvent) and e.progress is not None) or last[e.index] == i
    ]
