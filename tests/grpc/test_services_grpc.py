"""Both services as real in-process aio servers on port 0, called through real stubs:
health, reflection, the ingest and query paths, and status codes with google.rpc details."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc, retrieve_pb2, retrieve_pb2_grpc
from tests.support.rpc_details import rpc_details

DUCKS = (
    b"# Ducks\n\nDucks are waterfowl that swim on ponds and eat water plants.\n\n"
    b"## Habitat\n\nMallards live near lakes, rivers and city parks across the northern hemisphere.\n"
)
STOCKS = b"The stock market fell sharply on Tuesday after the central bank raised interest rates."


async def _upload(stub: ingest_pb2_grpc.IngestServiceStub, name: str, content: bytes, **spec: object):  # type: ignore[no-untyped-def]
    async def messages():  # type: ignore[no-untyped-def]
        yield ingest_pb2.UploadDocumentRequest(header=ingest_pb2.DocumentSpec(file_name=name, **spec))
        for start in range(0, len(content), 64):
            yield ingest_pb2.UploadDocumentRequest(data=content[start : start + 64])

    return await stub.UploadDocument(messages())


async def test_health_and_reflection(fake_stack) -> None:  # type: ignore[no-untyped-def]
    for address, service in (
        (fake_stack.ingest_address, "ragrpc.v1.IngestService"),
        (fake_stack.query_address, "ragrpc.v1.RetrieveService"),
    ):
        async with grpc.aio.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for name in ("", service):
                reply = await health.Check(health_pb2.HealthCheckRequest(service=name))
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
            responses = reflect.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
            listed = [s.name async for r in responses for s in r.list_services_response.service]
            assert service in listed and "grpc.health.v1.Health" in listed


async def test_upload_then_retrieve_and_ask(fake_stack) -> None:  # type: ignore[no-untyped-def]
    async with (
        grpc.aio.insecure_channel(fake_stack.ingest_address) as ingest_channel,
        grpc.aio.insecure_channel(fake_stack.query_address) as query_channel,
    ):
        ingest = ingest_pb2_grpc.IngestServiceStub(ingest_channel)
        first = await _upload(ingest, "ducks.md", DUCKS, document_id="ducks")
        stocks = await _upload(ingest, "stocks.txt", STOCKS)
        assert first.document.state == ingest_pb2.DOCUMENT_STATE_ACTIVE and not first.unchanged
        again = await _upload(ingest, "ducks.md", DUCKS, document_id="ducks")
        assert again.unchanged and again.document.chunk_count == first.document.chunk_count
        query = retrieve_pb2_grpc.RetrieveServiceStub(query_channel)
        # read your writes: without the token a query right after the uploads may run before the query
        # service has applied them (it follows the registry in the background)
        token = stocks.consistency_token
        assert token
        stream = query.Retrieve(retrieve_pb2.RetrieveRequest(query="where do mallards live", consistency_token=token))
        responses = [r async for r in stream]
        chunks = [r.chunk for r in responses if r.HasField("chunk")]
        assert responses[-1].HasField("summary") and chunks
        assert chunks[0].chunk.document_id == "ducks" and chunks[0].rank == 1
        assert "Habitat" in list(chunks[0].chunk.section_path) or chunks[0].chunk.title == "Ducks"
        asked = query.Ask(retrieve_pb2.AskRequest(query="Where do mallards live?", consistency_token=token))
        events = [e async for e in asked]
        kinds = [e.WhichOneof("event") for e in events]
        assert kinds[0] == "source" and kinds[-1] == "final" and "token" in kinds
        assert kinds.index("token") > max(i for i, k in enumerate(kinds) if k == "source")
        final = events[-1].final
        assert final.model == "extractive" and final.answer
        assert any(t.stage == "time_to_first_token" for t in final.timings)
        cited = {e.citation.document_id for e in events if e.HasField("citation")}
        assert "ducks" in cited


async def test_unsupported_media_type_is_invalid_argument(fake_stack) -> None:  # type: ignore[no-untyped-def]
    async with grpc.aio.insecure_channel(fake_stack.ingest_address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _upload(ingest_pb2_grpc.IngestServiceStub(channel), "picture.png", b"\x89PNG\r\n\x1a\n" + bytes(64))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "text/plain" in caught.value.details()
    assert rpc_details(caught.value)["ErrorInfo"].reason == "UNSUPPORTED_MEDIA_TYPE"


async def test_upload_limits_and_header_rules(fake_stack) -> None:  # type: ignore[no-untyped-def]
    async with grpc.aio.insecure_channel(fake_stack.ingest_address) as channel:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)

        async def no_header():  # type: ignore[no-untyped-def]
            yield ingest_pb2.UploadDocumentRequest(data=b"hello")

        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.UploadDocument(no_header())
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert rpc_details(caught.value)["BadRequest"].field_violations[0].field == "header"
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _upload(stub, "x.txt", b"hello", document_id="bad id with spaces")
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "document_id" in caught.value.details()


async def test_document_resources(fake_stack) -> None:  # type: ignore[no-untyped-def]
    async with grpc.aio.insecure_channel(fake_stack.ingest_address) as channel:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        for i in range(5):
            await _upload(stub, f"n{i}.txt", f"note number {i} about ponds".encode(), document_id=f"note-{i}")
        seen, token = [], ""
        while True:
            page = await stub.ListDocuments(ingest_pb2.ListDocumentsRequest(page_size=2, page_token=token))
            seen += [d.document_id for d in page.documents]
            token = page.next_page_token
            if not token:
                break
        assert seen == [f"note-{i}" for i in range(5)]
        doc = (await stub.GetDocument(ingest_pb2.GetDocumentRequest(document_id="note-3"))).document
        assert doc.state == ingest_pb2.DOCUMENT_STATE_ACTIVE and doc.chunk_count == 1
        deleted = await stub.DeleteDocument(ingest_pb2.DeleteDocumentRequest(document_id="note-3"))
        assert deleted.chunks_deleted == 1
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetDocument(ingest_pb2.GetDocumentRequest(document_id="note-3"))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_ingest_documents_streams_progress_then_summary(fake_stack) -> None:  # type: ignore[no-untyped-def]
    docs = [
        ingest_pb2.InlineDocument(spec=ingest_pb2.DocumentSpec(file_name="a.md", document_id="a"), content=DUCKS),
        ingest_pb2.InlineDocument(spec=ingest_pb2.DocumentSpec(file_name="b.bin"), content=b"\x00\x01\x02" * 10),
    ]
    async with grpc.aio.insecure_channel(fake_stack.ingest_address) as channel:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        events = [e async for e in stub.IngestDocuments(ingest_pb2.IngestDocumentsRequest(documents=docs))]
        assert events[-1].HasField("summary")
        summary = events[-1].summary
        assert (summary.succeeded, summary.failed) == (1, 1)
        last = {e.progress.index: e.progress for e in events if e.HasField("progress")}
        assert last[0].state == ingest_pb2.DOCUMENT_STATE_ACTIVE
        assert last[1].state == ingest_pb2.DOCUMENT_STATE_FAILED and last[1].error_message
        job = (await stub.GetIngestJob(ingest_pb2.GetIngestJobRequest(job_id=events[0].job_id))).job
        assert job.done and job.summary.succeeded == 1


async def test_ingest_documents_with_final_progress_streams_one_event_per_document(fake_stack) -> None:  # type: ignore[no-untyped-def]
    """PROGRESS_DETAIL_FINAL: each document's DONE event only (a failed one's with its error), then the
    summary; an unknown progress_detail is INVALID_ARGUMENT naming the field."""
    docs = [
        ingest_pb2.InlineDocument(spec=ingest_pb2.DocumentSpec(file_name="a.md", document_id="fa"), content=DUCKS),
        ingest_pb2.InlineDocument(spec=ingest_pb2.DocumentSpec(file_name="b.bin"), content=b"\x00\x01\x02" * 10),
        ingest_pb2.InlineDocument(
            spec=ingest_pb2.DocumentSpec(file_name="c.md", document_id="fc"), content=DUCKS + b"!"
        ),
    ]
    async with grpc.aio.insecure_channel(fake_stack.ingest_address) as channel:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        request = ingest_pb2.IngestDocumentsRequest(documents=docs, progress_detail=ingest_pb2.PROGRESS_DETAIL_FINAL)
        events = [e async for e in stub.IngestDocuments(request)]
        progress = [e.progress for e in events if e.HasField("progress")]
        assert sorted(p.index for p in progress) == [0, 1, 2] and len(events) == 4
        assert {p.stage for p in progress} == {ingest_pb2.INGEST_STAGE_DONE}
        by_index = {p.index: p for p in progress}
        assert by_index[0].state == by_index[2].state == ingest_pb2.DOCUMENT_STATE_ACTIVE
        assert by_index[1].state == ingest_pb2.DOCUMENT_STATE_FAILED and by_index[1].error_message
        assert events[-1].HasField("summary") and (events[-1].summary.succeeded, events[-1].summary.failed) == (2, 1)

        bad = ingest_pb2.IngestDocumentsRequest(documents=docs[:1], progress_detail=7)  # type: ignore[arg-type]
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            [e async for e in stub.IngestDocuments(bad)]
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert rpc_details(caught.value)["BadRequest"].field_violations[0].field == "progress_detail"


async def test_retrieve_rejects_bad_requests(fake_stack) -> None:  # type: ignore[no-untyped-def]
    async with grpc.aio.insecure_channel(fake_stack.query_address) as channel:
        stub = retrieve_pb2_grpc.RetrieveServiceStub(channel)
        for request, field in (
            (retrieve_pb2.RetrieveRequest(query="  "), "query"),
            (
                retrieve_pb2.RetrieveRequest(query="x", options=retrieve_pb2.RetrievalOptions(top_k=10_000)),
                "options.top_k",
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                [r async for r in stub.Retrieve(request)]
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert rpc_details(caught.value)["BadRequest"].field_violations[0].field == field
