"""The ingestion pipeline over deterministic fakes: states, de-duplication, safe replacement,
failure without leftovers, and recovery after a simulated crash."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from ingest_service.app import IngestComponents, build_components
from ingest_service.pipeline import ProgressEvent
from ingest_service.requests import DocumentSpecInput, IngestItem
from ragrpc import errors
from ragrpc.config import Settings
from ragrpc.models import DocumentState
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry, all_records

TEXT = ("Ducks are waterfowl. " * 40 + "\n\n" + "Geese are larger than ducks. " * 40).encode()


@pytest.fixture
def parts() -> tuple[InMemoryChunkStore, InMemoryDocumentRegistry, IngestComponents]:
    chunks, registry = InMemoryChunkStore(), InMemoryDocumentRegistry()
    settings = dataclasses.replace(
        Settings(), workers=2, chunk_size_tokens=60, chunk_overlap_tokens=8, replaced_version_grace_s=0.0
    )
    return chunks, registry, build_components(settings, HashingEmbedder(), chunks, registry)


def item(content: bytes = TEXT, document_id: str = "", file_name: str = "birds.txt") -> IngestItem:
    return IngestItem("t1", DocumentSpecInput(document_id=document_id, file_name=file_name), content)


def chunk_count(chunks: InMemoryChunkStore, document_id: str) -> int:
    return chunks.count_chunks(f.and_(f.eq(s.TENANT, "t1"), f.eq(s.DOCUMENT_ID, document_id)))


async def test_ingest_marks_active_and_reports_stages(parts) -> None:  # type: ignore[no-untyped-def]
    chunks, registry, app = parts
    events: list[ProgressEvent] = []
    outcome = await app.pipeline.ingest(item(), events.append)
    record = registry.get("t1", outcome.record.document_id)
    assert record is not None and record.state == DocumentState.ACTIVE
    assert record.chunk_count == chunk_count(chunks, record.document_id) > 1
    stages = [e.stage for e in events]
    assert stages[0] == "queued" and stages[-1] == "done"
    assert {"extracting", "chunking", "embedding", "writing"} <= set(stages)


@pytest.mark.parametrize("size", [len(TEXT), (1 << 20) + 17], ids=["small: on the loop", "large: in the executor"])
async def test_the_content_is_hashed_once_and_recorded(parts, size: int, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import hashlib
    import threading

    from ingest_service import requests

    _, registry, app = parts
    content = (TEXT * (size // len(TEXT) + 1))[:size]
    hashed_in: list[str] = []
    sha256 = hashlib.sha256

    def recording_sha256(data: bytes = b""):  # type: ignore[no-untyped-def]
        if data == content:
            hashed_in.append(threading.current_thread().name)
        return sha256(data)

    monkeypatch.setattr(requests.hashlib, "sha256", recording_sha256)
    outcome = await app.pipeline.ingest(item(content))
    digest = sha256(content).hexdigest()
    record = registry.get("t1", outcome.record.document_id)
    assert record is not None and record.content_hash == digest
    assert len(hashed_in) == 1, hashed_in  # once per document, not once per use
    assert (hashed_in[0] == threading.current_thread().name) == (size < (1 << 20)), hashed_in


async def test_same_content_twice_is_a_no_op(parts) -> None:  # type: ignore[no-untyped-def]
    chunks, _, app = parts
    first = await app.pipeline.ingest(item())
    before = chunk_count(chunks, first.record.document_id)
    second = await app.pipeline.ingest(item())
    assert second.unchanged and second.record.document_id == first.record.document_id
    assert chunk_count(chunks, first.record.document_id) == before


async def test_new_content_replaces_old_chunks(parts) -> None:  # type: ignore[no-untyped-def]
    chunks, registry, app = parts
    await app.pipeline.ingest(item(document_id="doc-1"))
    old_generation = registry.get("t1", "doc-1").generation
    await app.pipeline.ingest(item(b"Swans are the largest waterfowl.", document_id="doc-1"))
    record = registry.get("t1", "doc-1")
    assert record.generation != old_generation and record.chunk_count == 1
    stored = chunks.query_chunks(f.eq(s.DOCUMENT_ID, "doc-1"))
    assert [c.generation for c in stored] == [record.generation]
    assert "Swans" in stored[0].text


async def test_failed_write_leaves_no_chunks_and_failed_state(parts) -> None:  # type: ignore[no-untyped-def]
    chunks, registry, app = parts
    chunks.fail_next_insert = errors.UnavailableError("store went away")
    with pytest.raises(errors.UnavailableError):
        await app.pipeline.ingest(item(document_id="doc-2"))
    assert chunk_count(chunks, "doc-2") == 0
    record = registry.get("t1", "doc-2")
    assert record.state == DocumentState.FAILED and "store went away" in record.error
    assert record.pending_generation == ""


async def test_failed_replacement_keeps_previous_version(parts) -> None:  # type: ignore[no-untyped-def]
    chunks, registry, app = parts
    await app.pipeline.ingest(item(document_id="doc-3"))
    before = registry.get("t1", "doc-3")
    chunks.fail_next_insert = errors.UnavailableError("flaky")
    with pytest.raises(errors.UnavailableError):
        await app.pipeline.ingest(item(b"completely new text about swans", document_id="doc-3"))
    after = registry.get("t1", "doc-3")
    assert after.state == DocumentState.ACTIVE and after.generation == before.generation
    assert chunk_count(chunks, "doc-3") == before.chunk_count


async def test_unsupported_type_lists_supported_ones(parts) -> None:  # type: ignore[no-untyped-def]
    _, registry, app = parts
    with pytest.raises(errors.UnsupportedMediaTypeError) as caught:
        await app.pipeline.ingest(item(b"\x89PNG\r\n\x1a\n" + bytes(200), file_name="x.png"))
    assert "text/plain" in caught.value.message and "application/pdf" in caught.value.message


async def test_recovery_removes_leftovers_of_a_crash(parts) -> None:  # type: ignore[no-untyped-def]
    chunks, registry, app = parts
    await app.pipeline.ingest(item(document_id="doc-4"))
    record = registry.get("t1", "doc-4")
    # Simulate a crash after writing a new attempt's chunks but before the registry switch.
    leftovers = chunks.query_chunks(f.eq(s.DOCUMENT_ID, "doc-4"), with_vectors=True)
    for chunk in leftovers:
        chunk.chunk_id += "-new"
        chunk.generation = "crashed-attempt"
    chunks.insert_chunks(leftovers)
    record.pending_generation = "crashed-attempt"
    registry.put(record)
    # ... and a brand-new document that never finished.
    registry.put(
        dataclasses.replace(
            record, document_id="doc-5", state=DocumentState.PROCESSING, generation="", pending_generation="g5"
        )
    )
    counts = app.lifecycle.recover()
    assert counts["attempts_rolled_back"] == 2
    assert chunk_count(chunks, "doc-4") == record.chunk_count
    assert registry.get("t1", "doc-4").pending_generation == ""
    assert registry.get("t1", "doc-5").state == DocumentState.FAILED
    assert not all_records(registry, DocumentState.PROCESSING)


async def test_concurrent_ingest_of_one_id_is_serialised(parts) -> None:  # type: ignore[no-untyped-def]
    chunks, registry, app = parts
    await asyncio.gather(
        app.pipeline.ingest(item(TEXT, document_id="doc-6")),
        app.pipeline.ingest(item(b"other text entirely", document_id="doc-6")),
    )
    record = registry.get("t1", "doc-6")
    stored = chunks.query_chunks(f.eq(s.DOCUMENT_ID, "doc-6"))
    assert {c.generation for c in stored} == {record.generation}
    assert len(stored) == record.chunk_count


SCANNED_PDF = Path(__file__).resolve().parents[2].parent / "shared" / "eval" / "docs" / "pdf" / "docling__ocr_test.pdf"


@pytest.mark.skipif(not SCANNED_PDF.exists(), reason="shared corpus missing")
async def test_a_scanned_pdf_is_refused_and_its_record_shows_the_pages_without_text(parts) -> None:  # type: ignore[no-untyped-def]
    chunks, registry, app = parts
    with pytest.raises(errors.InvalidInputError, match="no text layer on 1 page"):
        await app.pipeline.ingest(item(SCANNED_PDF.read_bytes(), "scan", "scan.pdf"))
    record = registry.get("t1", "scan")
    assert record.state == DocumentState.FAILED and "OCR" in record.error
    assert record.pages_without_text == [1] and record.page_count == 1 and record.media_type == "application/pdf"
    assert chunk_count(chunks, "scan") == 0
    await app.pipeline.ingest(item(document_id="scan-later"))  # a replacement by a scan keeps the old facts
    with pytest.raises(errors.InvalidInputError):
        await app.pipeline.ingest(item(SCANNED_PDF.read_bytes(), "scan-later", "scan.pdf"))
    kept = registry.get("t1", "scan-later")
    assert kept.state == DocumentState.ACTIVE and kept.pages_without_text == [] and kept.media_type == "text/plain"


class FlakyRegistry(InMemoryDocumentRegistry):
    """A registry whose store goes away (every call UNAVAILABLE) while `down` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def get(self, tenant: str, document_id: str):  # type: ignore[no-untyped-def]
        if self.down:
            raise errors.UnavailableError("Milvus is unreachable")
        return super().get(tenant, document_id)

    def put(self, record) -> None:  # type: ignore[no-untyped-def]
        if self.down:
            raise errors.UnavailableError("Milvus is unreachable")
        super().put(record)


async def wait_until(predicate, timeout_s: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def flaky_parts() -> tuple[InMemoryChunkStore, FlakyRegistry, IngestComponents]:
    chunks, registry = InMemoryChunkStore(), FlakyRegistry()
    settings = dataclasses.replace(
        Settings(), workers=2, chunk_size_tokens=60, chunk_overlap_tokens=8, replaced_version_grace_s=0.0
    )
    app = build_components(settings, HashingEmbedder(), chunks, registry)
    app.lifecycle._settle_delays = (0.02,)  # retry quickly in the test
    return chunks, registry, app


async def test_failure_recorded_once_the_store_is_back_without_a_restart() -> None:
    chunks, registry, app = flaky_parts()

    def store_goes_away(batch) -> None:  # type: ignore[no-untyped-def]
        registry.down = True  # the outage starts while the chunks are being written
        raise errors.UnavailableError("Milvus is unreachable")

    chunks.insert_chunks = store_goes_away  # type: ignore[method-assign]
    with pytest.raises(errors.UnavailableError):
        await app.pipeline.ingest(item(document_id="doc-9"))
    assert registry._docs["t1/doc-9"].state == DocumentState.PROCESSING  # could not be recorded yet
    assert app.lifecycle.unsettled == 1
    await asyncio.sleep(0.1)
    assert app.lifecycle.unsettled == 1  # still retrying while the store is down
    registry.down = False
    await wait_until(lambda: app.lifecycle.unsettled == 0)
    record = registry.get("t1", "doc-9")
    assert record.state == DocumentState.FAILED and record.pending_generation == ""
    assert "unreachable" in record.error and chunk_count(chunks, "doc-9") == 0


async def test_replaced_chunks_removed_once_the_store_is_back() -> None:
    chunks, registry, app = flaky_parts()
    await app.pipeline.ingest(item(document_id="doc-10"))
    old = registry.get("t1", "doc-10").generation
    original_delete = chunks.delete_chunks

    def delete_fails_once(expr):  # type: ignore[no-untyped-def]
        chunks.delete_chunks = original_delete  # type: ignore[method-assign]
        raise errors.UnavailableError("Milvus is unreachable")

    chunks.delete_chunks = delete_fails_once  # type: ignore[method-assign]
    outcome = await app.pipeline.ingest(item(b"Swans are the largest waterfowl.", document_id="doc-10"))
    assert outcome.record.state == DocumentState.ACTIVE  # the new version is in place regardless
    await wait_until(lambda: app.lifecycle.unsettled == 0)
    record = registry.get("t1", "doc-10")
    assert record.stale_generation == "" and record.generation != old
    assert [c.generation for c in chunks.query_chunks(f.eq(s.DOCUMENT_ID, "doc-10"))] == [record.generation]


async def test_close_stops_waiting_for_the_store() -> None:
    chunks, registry, app = flaky_parts()

    def outage(batch):  # type: ignore[no-untyped-def]
        registry.down = True
        raise errors.UnavailableError("Milvus is unreachable")

    chunks.insert_chunks = outage  # type: ignore[method-assign]
    with pytest.raises(errors.UnavailableError):
        await app.pipeline.ingest(item(document_id="doc-11"))
    assert app.lifecycle.unsettled == 1
    await app.lifecycle.close()
    assert app.lifecycle.unsettled == 0


async def test_update_on_a_store_whose_upsert_breaks_partitions_copies_into_a_new_generation() -> None:
    """Milvus 2.3: UpdateDocument writes the chunks again under a fresh generation (same vectors,
    parents re-linked), switches the registry and drops the old rows, instead of upserting."""
    chunks, registry = InMemoryChunkStore(upsert_keeps_partitions=False), InMemoryDocumentRegistry()
    settings = dataclasses.replace(
        Settings(), workers=2, chunk_size_tokens=60, chunk_overlap_tokens=8, replaced_version_grace_s=0.0
    )
    app = build_components(settings, HashingEmbedder(), chunks, registry)
    spec = DocumentSpecInput(document_id="doc-12", file_name="birds.txt", chunking_strategy="hierarchical")
    await app.pipeline.ingest(IngestItem("t1", spec, TEXT))
    before = registry.get("t1", "doc-12")
    old_rows = {c.chunk_id: c for c in chunks.query_chunks(f.eq(s.DOCUMENT_ID, "doc-12"), with_vectors=True)}
    assert any(c.parent_id for c in old_rows.values())

    record = await app.documents.update("t1", "doc-12", fields=["tags"], tags=["birds"])

    assert record.generation != before.generation and not record.pending_generation and not record.stale_generation
    assert registry.get("t1", "doc-12").generation == record.generation
    new_rows = chunks.query_chunks(f.eq(s.DOCUMENT_ID, "doc-12"), with_vectors=True)
    assert len(new_rows) == len(old_rows) and {c.generation for c in new_rows} == {record.generation}
    assert all(c.tags == ("birds",) for c in new_rows)
    ids = {c.chunk_id for c in new_rows}
    assert not ids & set(old_rows) and all(c.parent_id in ids for c in new_rows if c.parent_id)
    by_text = {(c.text, c.kind): c.vector for c in old_rows.values()}
    assert all(by_text[(c.text, c.kind)] == c.vector for c in new_rows)  # nothing embedded again


class CountingRegistry(InMemoryDocumentRegistry):
    def __init__(self) -> None:
        super().__init__()
        self.job_writes = 0

    def put_job(self, job) -> None:  # type: ignore[no-untyped-def]
        self.job_writes += 1
        super().put_job(job)


async def test_job_progress_is_written_at_most_once_per_interval_but_start_and_end_always() -> None:
    chunks, registry = InMemoryChunkStore(), CountingRegistry()
    settings = dataclasses.replace(
        Settings(), workers=2, chunk_size_tokens=60, chunk_overlap_tokens=8, replaced_version_grace_s=0.0
    )
    app = build_components(settings, HashingEmbedder(), chunks, registry)
    items = [item(f"Document number {i} about herons.".encode(), document_id=f"j{i}") for i in range(20)]
    job_id, events = await app.jobs.start("t1", items)
    async for _ in events:
        pass
    stored = registry.get_job(job_id)
    assert stored is not None and stored.done and stored.summary["succeeded"] == 20
    assert all(d["stage"] == "done" for d in stored.documents)  # the final write holds every document
    assert 2 <= registry.job_writes < 20  # not one rewrite of the whole job per document


async def test_documents_share_one_token_counter_and_their_facts_and_headers_leave_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A token counter copies the model's tokenizer (~15 ms for the bundled model): made per document
    on the event loop it halved ingestion's rate. The facts and the context headers are worked out in
    the CPU executor, not on the loop every document's progress runs on (here without worker processes:
    tests/unit/test_document_workers.py shows them doing it in another process)."""
    import threading

    from ingest_service import preparation as pipeline_module

    embedder = HashingEmbedder()
    made: list[str] = []
    original = embedder.token_counter

    def counting_token_counter():  # type: ignore[no-untyped-def]
        made.append(threading.current_thread().name)
        return original()

    monkeypatch.setattr(embedder, "token_counter", counting_token_counter)
    settings = dataclasses.replace(Settings(), context_headers=True, ingest_processes=-1)
    app = build_components(settings, embedder, InMemoryChunkStore(), InMemoryDocumentRegistry())
    gathered_in: list[str] = []
    gather = pipeline_module.gather_facts

    def recording_gather(*args, **kwargs):  # type: ignore[no-untyped-def]
        gathered_in.append(threading.current_thread().name)
        return gather(*args, **kwargs)

    monkeypatch.setattr(pipeline_module, "gather_facts", recording_gather)
    loop_thread = threading.current_thread().name
    for number in range(5):
        outcome = await app.pipeline.ingest(item(f"Herons number {number} wade.".encode(), document_id=f"d{number}"))
        assert outcome.chunks_written == 1
    assert len(made) == 1, made  # the service's one counter, shared by the planner and the headers
    assert len(gathered_in) == 5 and loop_thread not in gathered_in


async def test_a_replaced_version_stays_readable_for_the_grace_period_then_goes() -> None:
    """Query services that have not applied the switch yet still read the old rows (a query finds the
    old or the new version, never neither); once the grace period is over they go, and the record's
    marker with them."""
    chunks, registry = InMemoryChunkStore(), InMemoryDocumentRegistry()
    settings = dataclasses.replace(
        Settings(), workers=2, chunk_size_tokens=60, chunk_overlap_tokens=8, replaced_version_grace_s=0.3
    )
    app = build_components(settings, HashingEmbedder(), chunks, registry)
    first = await app.pipeline.ingest(item(document_id="doc"))
    second = await app.pipeline.ingest(item(TEXT + b" Swans too.", document_id="doc"))
    old, new = first.record.generation, second.record.generation
    stored = registry.get("t1", "doc")
    assert stored.generation == new and stored.stale_generation == old
    generations = {c.generation for page in chunks.scan_chunks(f.eq(s.DOCUMENT_ID, "doc")) for c in page}
    assert generations == {old, new}
    await wait_until(lambda: app.lifecycle.unsettled == 0)
    generations = {c.generation for page in chunks.scan_chunks(f.eq(s.DOCUMENT_ID, "doc")) for c in page}
    assert generations == {new} and registry.get("t1", "doc").stale_generation == ""


async def test_the_document_timeout_counts_the_time_queued_for_a_slot() -> None:
    """A document that waits for its slot past the document timeout ends DEADLINE_EXCEEDED
    (DOCUMENT_TIMEOUT) without having written anything; one that got its slot in time is ingested."""
    chunks, registry = InMemoryChunkStore(), InMemoryDocumentRegistry()
    # 2 s: the second document gets its slot after 0.2 s and has the rest for its ingestion (with 0.5 s it
    # once ran out on a loaded machine, in `make test`)
    settings = dataclasses.replace(Settings(), workers=2, document_timeout_s=2.0)
    app = build_components(settings, HashingEmbedder(), chunks, registry)
    busy = asyncio.Lock()
    await busy.acquire()  # every slot is taken

    with pytest.raises(errors.DeadlineError) as waited:
        await app.pipeline.ingest(item(document_id="queued"), slot=busy)
    assert waited.value.reason == "DOCUMENT_TIMEOUT" and "waited" in waited.value.message
    assert registry.get("t1", "queued") is None and chunk_count(chunks, "queued") == 0

    async def free_soon() -> None:
        await asyncio.sleep(0.2)
        busy.release()

    freeing = asyncio.ensure_future(free_soon())
    outcome = await app.pipeline.ingest(item(document_id="in-time"), slot=busy)
    await freeing
    assert outcome.record.state == DocumentState.ACTIVE


async def test_an_update_by_copy_during_the_grace_period_leaves_no_orphan_of_the_replaced_version() -> None:
    """Milvus 2.3 updates by copying into a fresh generation, which becomes the record's replaced
    (stale) generation: the version still in its grace period must not lose its marker to it (its rows
    would then stay for ever, named by nothing; found by the chaos run on Milvus 2.3.5)."""
    from ragrpc.testing.invariants import check_store

    chunks, registry = InMemoryChunkStore(upsert_keeps_partitions=False), InMemoryDocumentRegistry()
    settings = dataclasses.replace(Settings(), workers=2, chunk_size_tokens=60, replaced_version_grace_s=0.3)
    app = build_components(settings, HashingEmbedder(), chunks, registry)
    await app.pipeline.ingest(item(document_id="doc"))
    await app.pipeline.ingest(item(TEXT + b" Swans too.", document_id="doc"))  # v1 in its grace period
    await app.documents.update("t1", "doc", fields=["tags"], tags=["birds"])
    await wait_until(lambda: app.lifecycle.unsettled == 0)
    check_store(chunks, registry, tenant="t1", settled=True).assert_ok()
