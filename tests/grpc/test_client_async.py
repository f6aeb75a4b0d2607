"""The asyncio clients against the real services (in-process, fake embedder and stores)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import grpc
import pytest

from clients import (
    AsyncIngestClient,
    AsyncRetrieveClient,
    BatchSummary,
    Cancelled,
    DeadlineExceeded,
    Final,
    InvalidArgument,
    NewDocument,
    NotFound,
    Progress,
    ResourceExhausted,
    Source,
    Unavailable,
)
from ragrpc import errors
from ragrpc.grpc_errors import abort_with_error
from ragrpc.v1 import ingest_pb2_grpc, retrieve_pb2, retrieve_pb2_grpc
from tests.grpc.test_client_sync import BREAD_TXT, GARDEN_TXT, MILVUS_MD, PNG_BYTES


async def _ingest_three(client: AsyncIngestClient) -> dict[str, str]:
    ids = {}
    for key, content, name in (
        ("milvus", MILVUS_MD, "milvus.md"),
        ("bread", BREAD_TXT, "bread.txt"),
        ("garden", GARDEN_TXT, "garden.txt"),
    ):
        ids[key] = (await client.upload(content.encode(), file_name=name)).document_id
    return ids


async def test_upload_get_list_update_delete(fake_stack, tmp_path: Path) -> None:
    path = tmp_path / "notes.md"
    path.write_text(MILVUS_MD)
    sent: list[int] = []
    async with AsyncIngestClient(fake_stack.ingest_address) as client:
        assert await client.health() == "SERVING"
        doc = await client.upload(path, title="Notes", chunk_bytes=100, on_progress=sent.append)
        assert sum(sent) == path.stat().st_size and len(sent) > 1
        assert doc.state == 3 and doc.media_type == "text/markdown" and doc.title == "Notes"
        await client.upload(BREAD_TXT.encode(), file_name="bread.txt", document_id="bread-1")
        await client.upload(GARDEN_TXT.encode(), file_name="garden.txt")
        assert (await client.get_document("bread-1")).source == "bread.txt"
        listed = [d.document_id async for d in client.list_documents(page_size=2)]
        assert len(listed) == 3 and listed == sorted(listed)
        updated = await client.update_document("bread-1", metadata={"k": "v"})
        assert dict(updated.metadata) == {"k": "v"}
        assert await client.delete_document("bread-1") > 0
        with pytest.raises(NotFound) as missing:
            await client.delete_document("bread-1")
        assert missing.value.reason and "bread-1" in missing.value.message


async def test_ingest_batch_streams_progress_then_summary(fake_stack) -> None:
    documents = [NewDocument(MILVUS_MD, file_name="milvus.md"), NewDocument(BREAD_TXT, file_name="bread.txt")]
    async with AsyncIngestClient(fake_stack.ingest_address) as client:
        stream = client.ingest(documents)
        events = [event async for event in stream]
        assert all(isinstance(e, Progress) for e in events[:-1]) and isinstance(events[-1], BatchSummary)
        assert {e.stage for e in events[:-1]} >= {"done"}
        assert stream.summary is not None and (stream.summary.succeeded, stream.summary.failed) == (2, 0)
        assert stream.summary.chunks_written > 0
        again = await client.ingest(documents).drain()
        assert again.summary is not None and again.summary.unchanged == 2
        job = await client.get_job(stream.job_id)
        assert job.done and [p.document_id for p in job.documents] == [stream.documents[i].document_id for i in (0, 1)]
        final = [e async for e in client.ingest(documents, final_only=True)]  # one event a document
        assert [e.stage for e in final[:-1]] == ["done", "done"] and isinstance(final[-1], BatchSummary)


async def test_retrieve_and_ask(fake_stack) -> None:
    async with (
        AsyncIngestClient(fake_stack.ingest_address) as ingest,
        AsyncRetrieveClient(fake_stack.query_address) as query,
    ):
        ids = await _ingest_three(ingest)
        stream = query.retrieve("Milvus vector database embeddings", top_k=3, fusion="weighted")
        hits = [hit async for hit in stream]
        assert hits[0].document_id == ids["milvus"] and hits[0].score_kind == "weighted"
        assert stream.summary is not None and stream.summary.returned == len(hits)

        ask = await query.ask("What does Milvus store?", top_k=2, template="analytical").drain()
        assert ask.final is not None and ask.final.model == "extractive"
        assert ask.sources and ask.sources[0].hit.document_id == ids["milvus"]
        assert ask.answer == ask.final.answer and ask.answer


async def test_ask_event_order_and_cancel(fake_stack) -> None:
    async with (
        AsyncIngestClient(fake_stack.ingest_address) as ingest,
        AsyncRetrieveClient(fake_stack.query_address) as query,
    ):
        await _ingest_three(ingest)
        order = []
        async for event in query.ask("How does sourdough bread rise?"):
            if not order or order[-1] != event.kind:
                order.append(event.kind)
        assert order[0] == "source" and order[-1] == "final" and "token" in order
        assert order.index("token") < order.index("final")
        if "citation" in order:
            assert order.index("token") < order.index("citation") < order.index("final")

        stream = query.ask("What does Milvus store?")
        async with stream:
            assert isinstance(await stream.__anext__(), Source)
        with pytest.raises(Cancelled):
            await stream.__anext__()
        assert not isinstance(stream.final, Final)


async def test_errors_are_typed(fake_stack) -> None:
    async with (
        AsyncIngestClient(fake_stack.ingest_address) as ingest,
        AsyncRetrieveClient(fake_stack.query_address) as query,
    ):
        with pytest.raises(NotFound):
            await ingest.get_document("no-such-document")
        with pytest.raises(InvalidArgument) as empty:
            await query.retrieve("").drain()
        assert empty.value.field_violations[0].field == "query"
        with pytest.raises(InvalidArgument) as bad_id:
            await ingest.delete_document("bad id!")
        assert bad_id.value.field_violations[0].field == "document_id"
        with pytest.raises(InvalidArgument) as unsupported:
            await ingest.upload(PNG_BYTES, file_name="image.png")
        assert unsupported.value.reason == "UNSUPPORTED_MEDIA_TYPE"
        with pytest.raises(InvalidArgument) as empty_ask:
            await query.ask("").drain()
        assert empty_ask.value.field_violations[0].field == "query"


class _FlakyServices(retrieve_pb2_grpc.RetrieveServiceServicer, ingest_pb2_grpc.IngestServiceServicer):
    """Fails every call with the status named by the request (through the services' own error
    mapping, so the rich details are real); counts the attempts the client's retry policy made."""

    def __init__(self) -> None:
        self.attempts: Counter[str] = Counter()
        self.metadata: list[dict[str, str]] = []

    async def _fail(self, key: str, context: grpc.aio.ServicerContext) -> None:
        self.attempts[key] += 1
        self.metadata.append({k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)})
        error = {
            "unavailable": errors.UnavailableError("store is down", retry_after_s=2.5),
            "exhausted": errors.LimitExceededError("overloaded"),
            "deadline": errors.DeadlineError("too slow"),
        }[key.split(":")[1]]
        await abort_with_error(context, error)

    async def Retrieve(self, request, context):  # type: ignore[no-untyped-def]
        await self._fail(f"retrieve:{request.query}", context)
        yield retrieve_pb2.RetrieveResponse()

    async def GetDocument(self, request, context):  # type: ignore[no-untyped-def]
        await self._fail(f"get:{request.document_id}", context)


async def test_retry_policy_per_service() -> None:
    flaky = _FlakyServices()
    server = grpc.aio.server()
    retrieve_pb2_grpc.add_RetrieveServiceServicer_to_server(flaky, server)
    ingest_pb2_grpc.add_IngestServiceServicer_to_server(flaky, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    try:
        async with AsyncRetrieveClient(address, api_key="k1") as query, AsyncIngestClient(address) as ingest:
            with pytest.raises(Unavailable) as down:
                await query.retrieve("unavailable", request_id="req-42").drain()
            assert down.value.retry_delay == 2.5 and down.value.reason == "UNAVAILABLE"
            with pytest.raises(ResourceExhausted):
                await query.retrieve("exhausted").drain()
            with pytest.raises(DeadlineExceeded):
                await query.retrieve("deadline").drain()
            with pytest.raises(Unavailable):
                await ingest.get_document("unavailable")
            with pytest.raises(ResourceExhausted):
                await ingest.get_document("exhausted")
    finally:
        await server.stop(0)
    assert flaky.metadata[0]["authorization"] == "Bearer k1" and flaky.metadata[0]["x-request-id"] == "req-42"
    assert "authorization" not in flaky.metadata[-1] and len(flaky.metadata[-1]["x-request-id"]) == 16
    assert flaky.attempts == {
        "retrieve:unavailable": 4,
        "retrieve:exhausted": 1,  # RESOURCE_EXHAUSTED is never retried (clients.channel)
        "retrieve:deadline": 1,
        "get:unavailable": 4,
        "get:exhausted": 1,
    }
