"""The ingest service's document workers (ingest_service.document_workers): documents are prepared in
worker processes, and the lifecycle holds across the process boundary: a worker killed mid-document
costs one retry on a fresh worker (twice: the document FAILS, never stays PROCESSING), a worker that
hangs past the document timeout is killed and replaced, and a document cancelled by a delete or by
shutdown does not leave its worker busy.

The probe enricher below runs inside the workers (RAGRPC_ENRICHERS names it), so the documents steer
what their worker does: report its process id, stall until a marker file exists, or kill itself."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from ingest_service.admission import AdmissionGate
from ingest_service.app import IngestComponents, build_components
from ingest_service.requests import DocumentSpecInput, IngestItem, SpooledUpload
from ragrpc import errors
from ragrpc.config import Settings
from ragrpc.enrich import DocumentEnrichment, DocumentSample
from ragrpc.models import DocumentState
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry

PROBE = f"{__name__}:WorkerProbe"


class WorkerProbe:
    """An enricher steered by the document's text: `STALL <dir>` writes `<dir>/started` (the worker's
    pid) and sleeps until `<dir>/go` exists, the first time only; `HANG` sleeps for ten minutes; `DIE`
    kills its own process. Every document gets the fact `prepared_by` = the preparing process's id."""

    name = "worker-probe"

    def enrich(self, document: DocumentSample) -> DocumentEnrichment:
        words = document.text.split()
        if "DIE" in words:
            os.kill(os.getpid(), signal.SIGKILL)
        if "HANG" in words:
            time.sleep(600)
        if "STALL" in words:
            directory = Path(words[words.index("STALL") + 1])
            started = directory / "started"
            if not started.exists():
                started.write_text(str(os.getpid()))
                while not (directory / "go").exists():
                    time.sleep(0.01)
        return DocumentEnrichment({"prepared_by": str(os.getpid())})

    def header_terms(self, metadata: Mapping[str, str], title: str) -> str:
        return ""


def _settings(**overrides: object) -> Settings:
    return dataclasses.replace(
        Settings(), workers=2, ingest_processes=1, enrichers=PROBE, context_headers=False, **overrides
    )


@pytest.fixture
def app() -> Iterator[IngestComponents]:
    components = build_components(_settings(), HashingEmbedder(), InMemoryChunkStore(), InMemoryDocumentRegistry())
    yield components
    components.shutdown()


def _item(text: str, document_id: str) -> IngestItem:
    return IngestItem("t1", DocumentSpecInput(document_id=document_id, file_name=f"{document_id}.txt"), text.encode())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _until(condition, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the condition did not come true in time")
        await asyncio.sleep(0.02)


async def _state(app: IngestComponents, document_id: str) -> DocumentState | None:
    record = await app.lifecycle.current("t1", document_id)
    return record.state if record is not None else None


async def test_documents_are_prepared_in_a_worker_process_and_errors_cross_back_as_raised(app) -> None:  # type: ignore[no-untyped-def]
    outcome = await app.pipeline.ingest(_item("Herons wade in shallow water.", "d1"))
    assert outcome.chunks_written == 1 and outcome.record.state == DocumentState.ACTIVE
    worker = int(outcome.record.metadata["prepared_by"])
    assert worker != os.getpid() and worker in app.workers.worker_pids()
    with pytest.raises(errors.InvalidInputError) as caught:  # raised in the worker: class and reason kept
        await app.pipeline.ingest(_item("   \n  ", "empty"))
    assert caught.value.reason == "NO_TEXT" and await _state(app, "empty") == DocumentState.FAILED


async def test_a_worker_killed_mid_document_is_replaced_and_the_document_prepared_again(app, tmp_path) -> None:  # type: ignore[no-untyped-def]
    task = asyncio.create_task(app.pipeline.ingest(_item(f"Herons STALL {tmp_path} wade.", "killed")))
    await _until((tmp_path / "started").exists)
    first = int((tmp_path / "started").read_text())
    os.kill(first, signal.SIGKILL)  # mid-document: it is extracting (its enricher stalls)
    outcome = await asyncio.wait_for(task, 30)
    assert outcome.record.state == DocumentState.ACTIVE and outcome.chunks_written == 1
    second = int(outcome.record.metadata["prepared_by"])
    assert second != first and app.workers.replaced == 1 and not _alive(first)


async def test_a_document_that_kills_its_worker_twice_fails_and_the_workers_go_on(app) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(errors.InternalError) as caught:
        await asyncio.wait_for(app.pipeline.ingest(_item("Herons DIE here.", "poison")), 60)
    assert caught.value.reason == "DOCUMENT_WORKER_DIED" and "SIGKILL" in caught.value.message
    record = await app.lifecycle.current("t1", "poison")
    assert record is not None and record.state == DocumentState.FAILED and record.error_code == "INTERNAL"
    assert app.workers.replaced == 2
    after = await app.pipeline.ingest(_item("Swans glide on the lake.", "after"))
    assert after.record.state == DocumentState.ACTIVE


async def test_a_worker_that_hangs_past_the_document_timeout_is_killed_and_replaced() -> None:
    app = build_components(
        _settings(document_timeout_s=1.5), HashingEmbedder(), InMemoryChunkStore(), InMemoryDocumentRegistry()
    )
    try:
        await asyncio.to_thread(app.workers.start)
        (hung,) = app.workers.worker_pids()
        started = time.monotonic()
        with pytest.raises(errors.DeadlineError) as caught:
            await app.pipeline.ingest(_item("Herons HANG forever.", "hangs"))
        assert caught.value.reason == "DOCUMENT_TIMEOUT" and time.monotonic() - started < 10
        assert await _state(app, "hangs") == DocumentState.FAILED
        await _until(lambda: not _alive(hung), 5)
        after = await app.pipeline.ingest(_item("Swans glide on the lake.", "after"))
        assert after.record.state == DocumentState.ACTIVE and int(after.record.metadata["prepared_by"]) != hung
    finally:
        app.shutdown()


async def test_a_delete_cancels_the_preparation_through_the_boundary_and_frees_the_worker(app) -> None:  # type: ignore[no-untyped-def]
    await asyncio.to_thread(app.workers.start)
    (busy,) = app.workers.worker_pids()
    task = asyncio.create_task(app.pipeline.ingest(_item("Herons HANG forever.", "deleted")))
    await _until(lambda: app.lifecycle.busy("t1", "deleted"))
    await asyncio.sleep(0.3)  # it is in the worker now, hanging
    await app.documents.delete("t1", "deleted")
    with pytest.raises(errors.AbortedError) as caught:
        await asyncio.wait_for(task, 10)
    assert caught.value.reason == "DELETED_DURING_INGESTION" and await _state(app, "deleted") is None
    await _until(lambda: not _alive(busy), 5)
    after = await app.pipeline.ingest(_item("Swans glide on the lake.", "after"))
    assert after.record.state == DocumentState.ACTIVE and int(after.record.metadata["prepared_by"]) != busy


async def test_shutdown_rolls_back_a_document_in_a_worker_and_stops_every_worker() -> None:
    registry = InMemoryDocumentRegistry()
    app = build_components(_settings(), HashingEmbedder(), InMemoryChunkStore(), registry)
    await asyncio.to_thread(app.workers.start)
    (busy,) = app.workers.worker_pids()
    reservation = AdmissionGate(10).reserve(1)
    task = app.ingestions.submit(_item("Herons HANG forever.", "stopped"), reservation)
    await _until(lambda: app.lifecycle.busy("t1", "stopped"))
    await asyncio.sleep(0.3)
    await app.stop(0.2)  # the grace period runs out: the ingestion is cancelled and rolled back
    app.shutdown()
    with pytest.raises(asyncio.CancelledError):
        await task
    record = registry.get("t1", "stopped")
    assert record is not None and record.state == DocumentState.FAILED and "stopped" in record.error
    await _until(lambda: not _alive(busy), 5)
    assert app.workers.worker_pids() == []


# ---- the next document waits in the worker's pipe (a slot sends it while the worker prepares one) ----


async def _in_the_pipe(app: IngestComponents) -> None:
    """Waits until nothing is queued for the (one) worker: what was submitted went into its pipe."""
    await _until(lambda: app.workers._jobs.empty())  # noqa: SLF001
    await asyncio.sleep(0.2)


async def test_a_document_waiting_in_the_pipe_of_a_killed_worker_goes_to_the_new_one_without_a_retry(
    app,  # type: ignore[no-untyped-def]
    tmp_path,
    caplog,
) -> None:
    head = asyncio.create_task(app.pipeline.ingest(_item(f"Herons STALL {tmp_path} wade.", "head")))
    await _until((tmp_path / "started").exists)
    first = int((tmp_path / "started").read_text())
    follower = asyncio.create_task(app.pipeline.ingest(_item("Swans glide on the lake.", "follower")))
    await _in_the_pipe(app)
    os.kill(first, signal.SIGKILL)  # the head dies mid-document; the follower had not started
    head_outcome, follower_outcome = await asyncio.wait_for(asyncio.gather(head, follower), 30)
    assert head_outcome.record.state == follower_outcome.record.state == DocumentState.ACTIVE
    assert int(follower_outcome.record.metadata["prepared_by"]) != first and app.workers.replaced == 1
    retried = [r.getMessage() for r in caplog.records if "once more" in r.getMessage()]
    assert len(retried) == 1 and "'head'" in retried[0]  # the head's one retry; the follower was not retried


async def test_a_delete_of_the_document_being_prepared_sends_the_one_behind_it_to_the_new_worker(
    app,  # type: ignore[no-untyped-def]
    caplog,
) -> None:
    await asyncio.to_thread(app.workers.start)
    (busy,) = app.workers.worker_pids()
    hung = asyncio.create_task(app.pipeline.ingest(_item("Herons HANG forever.", "deleted")))
    await _until(lambda: app.lifecycle.busy("t1", "deleted"))
    follower = asyncio.create_task(app.pipeline.ingest(_item("Swans glide on the lake.", "follower")))
    await _in_the_pipe(app)
    await app.documents.delete("t1", "deleted")
    with pytest.raises(errors.AbortedError):
        await asyncio.wait_for(hung, 10)
    outcome = await asyncio.wait_for(follower, 20)
    assert outcome.record.state == DocumentState.ACTIVE and int(outcome.record.metadata["prepared_by"]) != busy
    assert not [r for r in caplog.records if "once more" in r.getMessage()]


async def test_a_large_document_waits_for_an_empty_pipe_so_neither_side_blocks_on_a_full_one(app, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # The head's answers (hundreds of chunks) and the follower's bytes are each larger than a socket's
    # buffer: had the follower been sent while the worker stalls, the service would block sending it
    # while the worker blocks sending the head's answers.
    words = " ".join(f"word{i}" for i in range(120_000))
    head = asyncio.create_task(app.pipeline.ingest(_item(f"Herons STALL {tmp_path} wade. {words}", "head")))
    await _until((tmp_path / "started").exists)
    follower = asyncio.create_task(app.pipeline.ingest(_item(f"Swans glide. {words} {words}", "large")))
    await _in_the_pipe(app)
    (tmp_path / "go").write_text("")
    head_outcome, large = await asyncio.wait_for(asyncio.gather(head, follower), 60)
    assert head_outcome.chunks_written > 100 and large.record.state == DocumentState.ACTIVE


async def test_a_document_whose_upload_was_closed_before_a_worker_took_it_fails_alone(app) -> None:  # type: ignore[no-untyped-def]
    # An ingestion that ended (cancelled, timed out) closes its spooled upload; its job may still be queued
    # for a worker. The worker's thread used to read the closed upload halfway through sending it and die,
    # so the documents after it waited forever (CI's chaos test, 2026-12-08).
    upload = SpooledUpload(memory_limit=1024)
    upload.write(b"Herons wade in shallow water.")
    upload.close()
    closed = IngestItem("t1", DocumentSpecInput(document_id="closed", file_name="closed.txt"), upload=upload)
    with pytest.raises(errors.AbortedError) as caught:
        await asyncio.wait_for(app.pipeline.ingest(closed), 20)
    assert caught.value.reason == "UPLOAD_CLOSED"
    after = await asyncio.wait_for(app.pipeline.ingest(_item("Swans glide on the lake.", "after")), 20)
    assert after.record.state == DocumentState.ACTIVE and app.workers.replaced == 0
