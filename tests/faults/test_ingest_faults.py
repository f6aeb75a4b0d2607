"""Every store call of the writer's scenarios fails once, with every failure class, on the real ingest
service (servicer, pipeline, lifecycle, recovery) over the in-memory fakes behind the fault harness;
once the fault clears and the user retries (or restarts), the invariants hold: each ACTIVE
document has exactly its chunks, of its current generation, holding the content its hash names; no
chunk without a registry row; no marker left; admission back to 0; a retried upload of content that
is not stored is ingested, never answered `unchanged`; no error names an internal object."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.protobuf import field_mask_pb2

from ingest_service.recovery import recover_documents
from ragrpc.models import DocumentState
from ragrpc.testing.faults import ALL_KINDS
from ragrpc.v1 import ingest_pb2
from tests.faults.rig import (
    OTHERS,
    TENANT,
    V1,
    V2,
    IngestRig,
    Outcome,
    Scenario,
    call,
    content_hash,
    run_matrix,
)


async def nothing(rig: IngestRig) -> None:
    return None


async def v1_stored(rig: IngestRig) -> None:
    outcome = await rig.upload("doc", V1)
    assert outcome.ok, outcome


def expect_active(document_id: str, text: str):  # type: ignore[no-untyped-def]
    async def expect(rig: IngestRig) -> None:
        record = rig.stored(document_id)
        assert record is not None and record.state == DocumentState.ACTIVE, f"{document_id}: {record}"
        assert record.content_hash == content_hash(text), f"{document_id} does not hold the content uploaded last"
        assert record.chunk_count > 0

    return expect


def retry_upload(document_id: str, text: str):  # type: ignore[no-untyped-def]
    """What a user (and the client library, on UNAVAILABLE) does: upload the same bytes again until
    it is accepted; an `unchanged` answer must mean the content really is stored."""

    async def recover(rig: IngestRig, first: Outcome) -> None:
        for _ in range(3):
            before = rig.stored(document_id)
            again = await rig.upload(document_id, text)
            await rig.settled()
            if again.ok:
                if again.response.unchanged:
                    assert before is not None and before.state == DocumentState.ACTIVE, "unchanged, yet not stored"
                    assert before.content_hash == content_hash(text), "answered unchanged for content not stored"
                return
        raise AssertionError(f"the retried upload still fails: {again.code} {again.details}")

    return recover


async def upload_v1(rig: IngestRig) -> Outcome:
    return await rig.upload("doc", V1)


async def upload_v2(rig: IngestRig) -> Outcome:
    return await rig.upload("doc", V2)


UPDATE = ingest_pb2.UpdateDocumentRequest(
    document=ingest_pb2.Document(document_id="doc", title="A new title", tags=["kept"], metadata={"team": "birds"}),
    update_mask=field_mask_pb2.FieldMask(paths=["title", "tags", "metadata"]),
)


async def update(rig: IngestRig) -> Outcome:
    return await call(lambda: rig.stub.UpdateDocument(UPDATE))


async def retry_update(rig: IngestRig, first: Outcome) -> None:
    for _ in range(3):
        again = await update(rig)
        await rig.settled()
        if again.ok:
            return
    raise AssertionError(f"the retried update still fails: {again.code} {again.details}")


async def expect_updated(rig: IngestRig) -> None:
    await expect_active("doc", V1)(rig)
    record = rig.stored("doc")
    assert (record.title, record.tags, record.metadata.get("team")) == ("A new title", ["kept"], "birds"), record


async def delete(rig: IngestRig) -> Outcome:
    return await call(lambda: rig.stub.DeleteDocument(ingest_pb2.DeleteDocumentRequest(document_id="doc")))


async def retry_delete(rig: IngestRig, first: Outcome) -> None:
    for _ in range(3):
        again = await delete(rig)
        await rig.settled()
        if again.ok or again.code is grpc.StatusCode.NOT_FOUND:
            return
    raise AssertionError(f"the retried delete still fails: {again.code} {again.details}")


async def expect_deleted(rig: IngestRig) -> None:
    assert rig.stored("doc") is None, rig.stored("doc")
    assert rig.check().chunks == 0


def batch_request() -> ingest_pb2.IngestDocumentsRequest:
    return ingest_pb2.IngestDocumentsRequest(
        documents=[
            ingest_pb2.InlineDocument(
                spec=ingest_pb2.DocumentSpec(document_id=name, file_name=f"{name}.txt"), content=text.encode()
            )
            for name, text in OTHERS.items()
        ]
    )


async def batch(rig: IngestRig) -> Outcome:
    async def run() -> list[ingest_pb2.IngestDocumentsResponse]:
        return [message async for message in rig.stub.IngestDocuments(batch_request())]

    outcome = await call(run)
    if outcome.ok and outcome.response[-1].summary.failed:
        return Outcome(response=outcome.response, code=grpc.StatusCode.UNKNOWN, details="some documents failed")
    return outcome


async def retry_batch(rig: IngestRig, first: Outcome) -> None:
    for _ in range(3):
        again = await batch(rig)
        await rig.settled()
        if again.ok:
            return
    raise AssertionError(f"the retried batch still fails: {again.details}")


async def expect_batch(rig: IngestRig) -> None:
    for name, text in OTHERS.items():
        await expect_active(name, text)(rig)


SCENARIOS = [
    Scenario("first upload", nothing, upload_v1, retry_upload("doc", V1), expect_active("doc", V1)),
    Scenario("replacement", v1_stored, upload_v2, retry_upload("doc", V2), expect_active("doc", V2)),
    Scenario("metadata update", v1_stored, update, retry_update, expect_updated, fields=True),
    Scenario(
        "metadata update by a copy (Milvus 2.3)",
        v1_stored,
        update,
        retry_update,
        expect_updated,
        upsert_keeps_partitions=False,
        fields=True,
    ),
    Scenario("delete", v1_stored, delete, retry_delete, expect_deleted),
    Scenario("batch ingest", nothing, batch, retry_batch, expect_batch),
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_every_store_call_of_the_writer_fails_once(rig: IngestRig, scenario: Scenario) -> None:
    result = await run_matrix(rig, scenario, ALL_KINDS)
    print(f"\n{scenario.name}: {result.calls} store calls, {result.runs} runs, {result.faults} faults injected")
    assert result.calls >= 3 and result.runs >= result.calls
    assert not result.violations, f"{len(result.violations)} of {result.runs} runs:\n" + "\n".join(
        result.violations[:25]
    )


async def interrupted_collection(rig: IngestRig) -> None:
    """A collection as a crash leaves it: a first ingestion and a replacement in flight, a replaced
    version not removed yet, a delete half-done."""
    for name, text in OTHERS.items():
        assert (await rig.upload(name, text)).ok
    assert (await rig.upload("doc", V1)).ok
    await rig.settled()
    registry, chunks = rig.registry.inner, rig.chunks.inner
    from ingest_service.chunk_records import new_generation
    from ragrpc.store import filters as f
    from ragrpc.store import schema as s

    def copy_generation(document_id: str, generation: str) -> None:
        record = registry.get(TENANT, document_id)
        rows = [c for page in chunks.scan_chunks(f.eq(s.DOCUMENT_ID, document_id), with_vectors=True) for c in page]
        for row in rows:
            row.chunk_id = f"{generation[:20]}-{row.chunk_index}"
            row.generation = generation
        chunks.insert_chunks(rows)
        return record

    ibis = copy_generation("ibis", pending := new_generation())
    ibis.pending_generation = pending  # a replacement in flight
    registry.put(ibis)
    stork = copy_generation("stork", stale := new_generation())
    stork.stale_generation = stale  # a replaced version whose rows were not removed yet
    registry.put(stork)
    egret = registry.get(TENANT, "egret")
    egret.deleting = True  # a delete half-done
    registry.put(egret)
    first = registry.get(TENANT, "doc")
    first.state, first.generation, first.pending_generation = DocumentState.PROCESSING, "", first.generation
    registry.put(first)  # a first ingestion in flight, its rows written


async def recovery(rig: IngestRig) -> Outcome:
    try:
        await asyncio.to_thread(recover_documents, rig.registry, rig.chunks)
    except Exception as exc:  # noqa: BLE001 - the start fails; the process is started again
        return Outcome(code=grpc.StatusCode.UNAVAILABLE, details=f"{type(exc).__name__}")
    return Outcome()


async def restart(rig: IngestRig, first: Outcome) -> None:
    if not first.ok:
        again = await recovery(rig)
        assert again.ok, again


async def expect_recovered(rig: IngestRig) -> None:
    assert rig.stored("egret") is None
    assert rig.stored("doc").state == DocumentState.FAILED
    await expect_active("ibis", OTHERS["ibis"])(rig)
    await expect_active("stork", OTHERS["stork"])(rig)


async def test_every_store_call_of_recovery_at_start_fails_once(rig: IngestRig) -> None:
    scenario = Scenario("recovery at start", interrupted_collection, recovery, restart, expect_recovered)
    result = await run_matrix(rig, scenario, ALL_KINDS)
    print(f"\n{scenario.name}: {result.calls} store calls, {result.runs} runs, {result.faults} faults injected")
    assert result.calls >= 8
    assert not result.violations, "\n".join(result.violations[:25])
