"""The per-document chunk limit (RAGRPC_MAX_CHUNKS_PER_DOCUMENT), through the real ingest pipeline
over deterministic fakes and once over gRPC: a document at the limit is ACTIVE; one over it is refused
with RESOURCE_EXHAUSTED / TOO_MANY_CHUNKS before anything is embedded or stored, and ends FAILED (a
replacement leaves the previous version ACTIVE and searchable). Parent chunks count: the limit is on
stored rows."""

from __future__ import annotations

import dataclasses

import grpc
import pytest

from ingest_service.app import IngestComponents, build_components
from ingest_service.pipeline import ProgressEvent
from ingest_service.requests import DocumentSpecInput, IngestItem
from ragrpc import errors
from ragrpc.config import Settings
from ragrpc.models import DocumentState
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc, retrieve_pb2, retrieve_pb2_grpc
from tests.conftest import FakeStack, running_stack
from tests.support.rpc_details import rpc_details

SETTING = "RAGRPC_MAX_CHUNKS_PER_DOCUMENT"
TEXT = "\n\n".join(f"Paragraph {i} tells of ducks, geese and swans on pond {i}. " * 12 for i in range(8)).encode()
SWANS = b"Swans are the largest waterfowl and glide on quiet lakes."
MARKDOWN = "\n\n".join(
    f"# Part {p}\n\n"
    + "\n\n".join(f"## Section {p}.{q}\n\n" + f"Herons wade in marsh {p}.{q}. " * 30 for q in range(3))
    for p in range(3)
).encode()


@dataclasses.dataclass
class Parts:
    chunks: InMemoryChunkStore
    registry: InMemoryDocumentRegistry
    embedder: HashingEmbedder
    app: IngestComponents


def build(limit: int) -> Parts:
    chunks, registry, embedder = InMemoryChunkStore(), InMemoryDocumentRegistry(), HashingEmbedder()
    settings = dataclasses.replace(
        Settings(), workers=2, chunk_size_tokens=60, chunk_overlap_tokens=8, max_chunks_per_document=limit
    )
    return Parts(chunks, registry, embedder, build_components(settings, embedder, chunks, registry))


def item(content: bytes, document_id: str, file_name: str = "birds.txt", strategy: str = "auto") -> IngestItem:
    spec = DocumentSpecInput(document_id=document_id, file_name=file_name, chunking_strategy=strategy)
    return IngestItem("t1", spec, content)


def stored_rows(chunks: InMemoryChunkStore, document_id: str) -> int:
    return chunks.count_chunks(f.and_(f.eq(s.TENANT, "t1"), f.eq(s.DOCUMENT_ID, document_id)))


async def rows_without_limit(content: bytes, file_name: str = "birds.txt", strategy: str = "auto") -> tuple[int, int]:
    """(stored rows, retrievable chunks) of `content` ingested under a limit it cannot reach."""
    parts = build(1_000_000)
    try:
        outcome = await parts.app.pipeline.ingest(item(content, "probe", file_name, strategy))
        return stored_rows(parts.chunks, "probe"), outcome.record.chunk_count
    finally:
        parts.app.shutdown()


async def test_a_document_at_the_limit_is_active() -> None:
    rows, _ = await rows_without_limit(TEXT)
    assert rows > 2
    parts = build(rows)
    try:
        outcome = await parts.app.pipeline.ingest(item(TEXT, "doc-1"))
        record = parts.registry.get("t1", "doc-1")
        assert record is not None and record.state == DocumentState.ACTIVE
        assert outcome.record.chunk_count == stored_rows(parts.chunks, "doc-1") == rows
    finally:
        parts.app.shutdown()


async def test_a_document_over_the_limit_is_refused_before_anything_is_embedded_or_stored() -> None:
    rows, _ = await rows_without_limit(TEXT)
    limit = rows - 1
    parts = build(limit)
    events: list[ProgressEvent] = []
    calls_before = parts.embedder.calls
    try:
        with pytest.raises(errors.LimitExceededError) as caught:
            await parts.app.pipeline.ingest(item(TEXT, "doc-2"), events.append)
        error = caught.value
        assert errors.status_name(error) == "RESOURCE_EXHAUSTED" and error.reason == "TOO_MANY_CHUNKS"
        assert SETTING in error.message and f"limit of {limit} " in error.message and f" {rows} chunks" in error.message
        assert error.metadata == {"setting": SETTING, "limit": str(limit), "chunk_count": str(rows)}
        assert parts.embedder.calls == calls_before  # nothing embedded
        assert stored_rows(parts.chunks, "doc-2") == 0 and parts.chunks.count_chunks(f.eq(s.TENANT, "t1")) == 0
        record = parts.registry.get("t1", "doc-2")
        assert record is not None and record.state == DocumentState.FAILED
        assert record.error_code == "RESOURCE_EXHAUSTED" and SETTING in record.error
        assert record.pending_generation == "" and record.generation == "" and record.chunk_count == 0
        stages = [e.stage for e in events]
        assert "embedding" not in stages and "writing" not in stages
        assert events[-1].state == DocumentState.FAILED and events[-1].error_code == "RESOURCE_EXHAUSTED"
    finally:
        parts.app.shutdown()


async def test_parent_chunks_count_as_stored_rows() -> None:
    rows, retrievable = await rows_without_limit(MARKDOWN, "herons.md", "hierarchical")
    assert rows > retrievable > 1  # the hierarchical plan stores parents as well
    refused = build(retrievable)  # enough for the retrievable chunks alone, not for the parents too
    try:
        with pytest.raises(
            errors.LimitExceededError, match=f"{retrievable} retrievable \\+ {rows - retrievable} parent"
        ):
            await refused.app.pipeline.ingest(item(MARKDOWN, "herons", "herons.md", "hierarchical"))
        assert stored_rows(refused.chunks, "herons") == 0
    finally:
        refused.app.shutdown()
    accepted = build(rows)
    try:
        await accepted.app.pipeline.ingest(item(MARKDOWN, "herons", "herons.md", "hierarchical"))
        assert stored_rows(accepted.chunks, "herons") == rows
    finally:
        accepted.app.shutdown()


async def test_an_over_limit_replacement_keeps_the_previous_version_active_and_searchable() -> None:
    rows, _ = await rows_without_limit(TEXT)
    parts = build(rows - 1)
    try:
        await parts.app.pipeline.ingest(item(SWANS, "doc-3"))
        before = parts.registry.get("t1", "doc-3")
        assert before is not None and before.state == DocumentState.ACTIVE
        old_chunks = sorted((c.chunk_id, c.text) for c in parts.chunks.query_chunks(f.eq(s.DOCUMENT_ID, "doc-3")))
        calls_before = parts.embedder.calls
        with pytest.raises(errors.LimitExceededError, match=SETTING):
            await parts.app.pipeline.ingest(item(TEXT, "doc-3"))
        assert parts.embedder.calls == calls_before
        after = parts.registry.get("t1", "doc-3")
        assert after is not None and after.state == DocumentState.ACTIVE
        assert (after.generation, after.content_hash, after.chunk_count) == (
            before.generation,
            before.content_hash,
            before.chunk_count,
        )
        assert after.pending_generation == ""
        stored = parts.chunks.query_chunks(f.eq(s.DOCUMENT_ID, "doc-3"))
        assert sorted((c.chunk_id, c.text) for c in stored) == old_chunks
        visible = f.and_(f.eq(s.TENANT, "t1"), f.eq(s.GENERATION, after.generation))
        hits = parts.chunks.search_dense(parts.embedder.embed_query("largest waterfowl swans"), visible, 5)
        assert hits and hits[0].chunk.document_id == "doc-3" and "Swans" in hits[0].chunk.text
    finally:
        parts.app.shutdown()


def test_the_setting_is_read_and_has_no_unlimited_value() -> None:
    assert Settings().max_chunks_per_document == 20_000
    assert Settings.from_env({SETTING: "500"}).max_chunks_per_document == 500
    for bad in (0, -1):
        with pytest.raises(ValueError, match=SETTING):
            build(bad)


async def test_over_grpc_the_refusal_is_resource_exhausted_with_its_reason(settings: Settings) -> None:
    rows, _ = await rows_without_limit(TEXT)
    tight = dataclasses.replace(
        settings, chunk_size_tokens=60, chunk_overlap_tokens=8, max_chunks_per_document=rows - 1
    )
    stores = FakeStack(HashingEmbedder(), InMemoryChunkStore(), InMemoryDocumentRegistry())
    async with (
        running_stack(tight, stores) as stack,
        grpc.aio.insecure_channel(stack.ingest_address) as ingest_channel,
        grpc.aio.insecure_channel(stack.query_address) as query_channel,
    ):
        ingest = ingest_pb2_grpc.IngestServiceStub(ingest_channel)

        async def upload(content: bytes, document_id: str):  # type: ignore[no-untyped-def]
            async def messages():  # type: ignore[no-untyped-def]
                header = ingest_pb2.DocumentSpec(file_name="birds.txt", document_id=document_id)
                yield ingest_pb2.UploadDocumentRequest(header=header)
                yield ingest_pb2.UploadDocumentRequest(data=content)

            return await ingest.UploadDocument(messages())

        await upload(SWANS, "swans")
        for document_id in ("swans", "flood"):  # a replacement, then a new document
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await upload(TEXT, document_id)
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert SETTING in caught.value.details()
            info = rpc_details(caught.value)["ErrorInfo"]
            assert info.reason == "TOO_MANY_CHUNKS"
            assert info.metadata["limit"] == str(rows - 1) and info.metadata["chunk_count"] == str(rows)
        flood = (await ingest.GetDocument(ingest_pb2.GetDocumentRequest(document_id="flood"))).document
        assert flood.state == ingest_pb2.DOCUMENT_STATE_FAILED and SETTING in flood.error_message
        swans = (await ingest.GetDocument(ingest_pb2.GetDocumentRequest(document_id="swans"))).document
        assert swans.state == ingest_pb2.DOCUMENT_STATE_ACTIVE and swans.chunk_count == 1
        await stack.followed()
        query = retrieve_pb2_grpc.RetrieveServiceStub(query_channel)
        found = [r async for r in query.Retrieve(retrieve_pb2.RetrieveRequest(query="largest waterfowl swans"))]
        chunks = [r.chunk.chunk for r in found if r.HasField("chunk")]
        assert [c.document_id for c in chunks] == ["swans"] and "Swans" in chunks[0].text
