"""Integration fixtures: a real milvus-lite server process and the real bundled model."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from ragrpc.config import Settings
from ragrpc.embeddings import SentenceTransformerEmbedder
from tests.support.milvus_server import MilvusLiteServer, start_milvus_lite


@pytest.fixture(scope="session")
def real_embedder() -> SentenceTransformerEmbedder:
    embedder = SentenceTransformerEmbedder()
    embedder.warm_up()
    return embedder


@pytest.fixture(scope="module")
def milvus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MilvusLiteServer]:
    server = start_milvus_lite(Path(tmp_path_factory.mktemp("milvus")))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def milvus_settings(milvus: MilvusLiteServer, request: pytest.FixtureRequest) -> Settings:
    prefix = "t_" + "".join(ch if ch.isalnum() else "_" for ch in request.node.name)[:40]
    return dataclasses.replace(
        Settings(), milvus_uri=milvus.uri, collection_prefix=prefix, workers=2, ingest_port=0, query_port=0
    )
