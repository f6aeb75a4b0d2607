"""Fixtures of the document-lifecycle tests: the stores (the in-memory fakes in the regular suite, a
real milvus-lite server marked slow) and a real ingest service over gRPC on them."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest

from ingest_service.app import build_components, start_ingest_server
from ragrpc.config import Settings
from ragrpc.store.factory import open_milvus_stores
from ragrpc.testing import InMemoryChunkStore, InMemoryDocumentRegistry
from ragrpc.v1 import ingest_pb2_grpc
from tests.support.lifecycle import SlowEmbedder, World


@pytest.fixture(params=["memory", pytest.param("milvus-lite", marks=pytest.mark.slow)])
def stores(request: pytest.FixtureRequest) -> Iterator[World]:
    embedder = SlowEmbedder(pause_s=0.02)
    base = dataclasses.replace(
        Settings(),
        workers=2,
        chunk_size_tokens=40,
        chunk_overlap_tokens=0,
        embedding_call_size=4,
        embedding_batch_size=4,
        sparse_backend="rank_bm25",
        ingest_port=0,
        replaced_version_grace_s=0.0,  # the replaced rows go at the switch (the grace has tests of its own)
    )
    if request.param == "memory":
        yield World(base, embedder, InMemoryChunkStore(), InMemoryDocumentRegistry())
        return
    milvus_settings: Settings = request.getfixturevalue("milvus_settings")
    settings = dataclasses.replace(
        base, milvus_uri=milvus_settings.milvus_uri, collection_prefix=milvus_settings.collection_prefix
    )
    opened = open_milvus_stores(settings, model_id=embedder.model_id, dimension=embedder.dimension, writer=True)
    yield World(settings, embedder, opened.chunks, opened.registry)


@pytest.fixture
async def world(stores: World) -> AsyncIterator[World]:
    stores.ingest = build_components(stores.settings, stores.embedder, stores.chunks, stores.registry)
    server = await start_ingest_server(stores.settings, stores.ingest, "127.0.0.1:0")
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    stores.stub = ingest_pb2_grpc.IngestServiceStub(channel)
    try:
        yield stores
    finally:
        await channel.close()
        await stores.ingest.stop(5.0)
        await server.stop(0)
        stores.ingest.shutdown()
