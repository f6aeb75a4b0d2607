"""VARCHAR limits are UTF-8 bytes, as a Milvus server counts them (milvus-lite counts characters, so
the in-memory fakes count bytes to match the server): a field a caller gives over its byte limit is
INVALID_ARGUMENT naming the field and the limit, before anything is stored; a value the service
derives (a title from a heading, a section path) is cut to fit on a character boundary."""

from __future__ import annotations

import grpc
import pytest

from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.testing import InMemoryChunkStore
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc
from tests.conftest import FakeStack
from tests.support.rpc_details import rpc_details

CJK = "東京都の図書館"  # 7 characters, 21 bytes


async def upload(stub: ingest_pb2_grpc.IngestServiceStub, spec: ingest_pb2.DocumentSpec, data: bytes) -> None:
    await stub.UploadDocument(
        iter([ingest_pb2.UploadDocumentRequest(header=spec), ingest_pb2.UploadDocumentRequest(data=data)])
    )


@pytest.mark.parametrize(
    ("spec", "field", "limit"),
    [
        (ingest_pb2.DocumentSpec(file_name="a.txt", title=(CJK * 58)[:400]), "header.title", s.VARCHAR_LIMITS[s.TITLE]),
        (ingest_pb2.DocumentSpec(file_name="a.txt", tags=[(CJK * 8)[:50]]), "header.tags", s.MAX_TAG_LENGTH),
        (ingest_pb2.DocumentSpec(file_name="a.txt", source=CJK * 100), "header.source", s.VARCHAR_LIMITS[s.SOURCE]),
    ],
    ids=["title of 400 CJK characters", "tag of 50 CJK characters", "source of 700 CJK characters"],
)
async def test_a_field_over_its_byte_limit_is_invalid_argument_naming_it(
    fake_stack: FakeStack, spec: ingest_pb2.DocumentSpec, field: str, limit: int
) -> None:
    async with grpc.aio.insecure_channel(fake_stack.ingest_address) as channel:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await upload(stub, spec, b"Some text about libraries.")
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert f"{limit} bytes" in (refused.value.details() or "")
    details = rpc_details(refused.value)
    assert [v.field for v in details["BadRequest"].field_violations] == [field]
    assert details["ErrorInfo"].metadata["limit_bytes"] == str(limit)
    assert fake_stack.registry.get("default", "a.txt") is None and fake_stack.chunks.count_chunks(s_tenant()) == 0


def s_tenant() -> f.FilterExpr:
    return f.eq(s.TENANT, "default")


async def test_a_long_cjk_heading_becomes_a_title_cut_to_fit_its_bytes(fake_stack: FakeStack) -> None:
    heading = (CJK * 60)[:300]  # 300 characters, 900 bytes: fits; 400 would not
    markdown = f"# {heading}{CJK * 50}\n\n本文です。図書館は静かです。\n".encode()
    async with grpc.aio.insecure_channel(fake_stack.ingest_address) as channel:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        await upload(stub, ingest_pb2.DocumentSpec(document_id="jp", file_name="jp.md"), markdown)
    chunk = fake_stack.chunks.query_chunks(s_tenant(), limit=10)[0]
    assert s.utf8_length(chunk.title) <= s.VARCHAR_LIMITS[s.TITLE] and chunk.title.startswith(CJK)


def test_the_fakes_count_bytes_as_a_milvus_server_does() -> None:
    from ragrpc import errors
    from ragrpc.models import ChunkRecord

    chunk = ChunkRecord(
        chunk_id="c1",
        document_id="d",
        tenant="t",
        collection="c",
        generation="g",
        text="x",
        vector=[0.1],
        chunk_index=0,
        chunker="fixed",
        media_type=(CJK * 12)[:80],  # 80 characters (milvus-lite takes it), 240 bytes > 128 (a server does not)
    )
    with pytest.raises(errors.InvalidInputError) as refused:
        InMemoryChunkStore().insert_chunks([chunk])
    assert refused.value.reason == "STORE_REFUSED_DATA" and "media_type" not in refused.value.message
