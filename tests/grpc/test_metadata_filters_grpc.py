"""MetadataFilter.metadata through the real services (in-process, port 0, real stubs): exact matches on
the keys the collection declares, the deprecated fields as aliases, INVALID_ARGUMENT with a BadRequest
naming the key for one it does not declare or a value too long for its field (at ingestion too), and
the client library's `metadata=` option. The language enricher fills a key no request gave."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import grpc
import pytest

from clients.sync_client import RetrieveClient
from ragrpc.config import Settings
from ragrpc.store.metadata_fields import MetadataFields
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc, retrieve_pb2, retrieve_pb2_grpc
from tests.conftest import FakeStack, running_stack
from tests.support.async_calls import retrieve_chunks, upload_document
from tests.support.rpc_details import rpc_details

KEYS = ("department", "language", "ticker")
DOCUMENTS = {
    "sales-de": ("sales", "Acme Nordwerk: die Verkäufe sind im dritten Quartal gestiegen, und die Kunden kamen. " * 3),
    "sales-en": ("sales", "Acme Nordwerk: sales grew in the third quarter and the customers came from the north. " * 3),
    "legal-en": ("legal", "Acme Nordwerk: the contract was signed in the third quarter, the lawyers came north. " * 3),
}


@pytest.fixture
async def stack(settings: Settings) -> AsyncIterator[FakeStack]:
    configured = dataclasses.replace(settings, enrichers="language", metadata_filter_keys=",".join(KEYS))
    chunks = InMemoryChunkStore(metadata_fields=MetadataFields(KEYS))
    async with running_stack(configured, FakeStack(HashingEmbedder(), chunks, InMemoryDocumentRegistry())) as running:
        yield running


async def test_retrieve_filters_on_declared_keys_and_names_the_key_it_cannot(stack: FakeStack) -> None:
    async with (
        grpc.aio.insecure_channel(stack.ingest_address) as ingest_channel,
        grpc.aio.insecure_channel(stack.query_address) as query_channel,
    ):
        ingest = ingest_pb2_grpc.IngestServiceStub(ingest_channel)
        query = retrieve_pb2_grpc.RetrieveServiceStub(query_channel)
        for document_id, (department, text) in DOCUMENTS.items():
            document = await upload_document(
                ingest,
                text.encode(),
                file_name=f"{document_id}.txt",
                document_id=document_id,
                metadata={"department": department},
            )
            assert document.state == ingest_pb2.DOCUMENT_STATE_ACTIVE
        await stack.followed()

        async def found(mode: int = retrieve_pb2.RETRIEVAL_MODE_HYBRID, **where: list[str]) -> set[str]:
            flt = retrieve_pb2.MetadataFilter(
                metadata={k: retrieve_pb2.MetadataValues(values=v) for k, v in where.items()}
            )
            hits, _ = await retrieve_chunks(query, "Acme Nordwerk quarter", top_k=10, mode=mode, filter=flt)
            return {h.chunk.document_id for h in hits}

        assert await found() == set(DOCUMENTS)
        for mode in (retrieve_pb2.RETRIEVAL_MODE_DENSE, retrieve_pb2.RETRIEVAL_MODE_SPARSE):
            assert await found(mode, department=["sales"]) == {"sales-de", "sales-en"}
            assert await found(mode, department=["sales"], language=["en"]) == {"sales-en"}  # the enricher's key
            assert await found(mode, department=["legal", "sales"], language=["de"]) == {"sales-de"}
            assert await found(mode, department=["Sales"]) == set()

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await found(team=["x"])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "'team' is not declared" in (refused.value.details() or "")
        details = rpc_details(refused.value)
        assert details["ErrorInfo"].reason == "METADATA_KEY_NOT_DECLARED"
        assert details["BadRequest"].field_violations[0].field == "options.filter.metadata[team]"

        alias = retrieve_pb2.MetadataFilter(tickers=["AMD"])
        alias.metadata["ticker"].values.append("AMD")
        with pytest.raises(grpc.aio.AioRpcError) as twice:
            await retrieve_chunks(query, "quarter", filter=alias)
        assert twice.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "filtered twice" in (
            twice.value.details() or ""
        )

        with pytest.raises(grpc.aio.AioRpcError) as too_long:
            await upload_document(
                ingest, b"Some notes.", file_name="long.txt", document_id="long", metadata={"department": "d" * 513}
            )
        assert too_long.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "metadata 'department' is 513 bytes" in (too_long.value.details() or "")

        def with_the_client() -> set[str]:
            with RetrieveClient(stack.query_address) as client:
                hits, _ = client.search(
                    "Acme Nordwerk quarter", top_k=10, metadata={"department": "sales", "language": ["de"]}
                )
                return {hit.chunk.document_id for hit in hits}

        assert await asyncio.to_thread(with_the_client) == {"sales-de"}
