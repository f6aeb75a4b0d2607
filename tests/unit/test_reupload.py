"""The same bytes uploaded again: nothing is extracted or embedded again when the request asks for what the
stored document was made with; another chunking, title or metadata ingests it again; new tags are applied
without re-embedding."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from ingest_service.app import build_components
from ingest_service.requests import DocumentSpecInput, IngestItem
from ingest_service.reupload import CHUNKING_KEY, chunking_request, reingest_reason
from ragrpc.config import Settings
from ragrpc.models import DocumentRecord
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry

TEXT = ("Ducks dabble in shallow water. Geese fly south in autumn. Swans nest by the lake. " * 40).encode()


class CountingEmbedder(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__(dimension=32)
        self.embedded = 0

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        self.embedded += len(texts)
        return super().embed_documents(texts)


@dataclasses.dataclass
class World:
    ingest: Any
    chunks: InMemoryChunkStore
    registry: InMemoryDocumentRegistry
    embedder: CountingEmbedder

    async def upload(self, **spec: Any) -> Any:
        spec = {"document_id": "d", "file_name": "d.txt", **spec}
        return await self.ingest.pipeline.ingest(IngestItem("t", DocumentSpecInput(**spec), TEXT))

    def chunk_ids(self) -> set[str]:
        return {c.chunk_id for page in self.chunks.scan_chunks(f.eq(s.DOCUMENT_ID, "d")) for c in page}

    def record(self) -> DocumentRecord:
        record = self.registry.get("t", "d")
        assert record is not None
        return record


@pytest.fixture
def world() -> Iterator[World]:
    chunks, registry, embedder = InMemoryChunkStore(), InMemoryDocumentRegistry(), CountingEmbedder()
    settings = dataclasses.replace(Settings(), workers=1, replaced_version_grace_s=0.0)
    ingest = build_components(settings, embedder, chunks, registry)
    yield World(ingest, chunks, registry, embedder)
    ingest.shutdown()


async def test_the_same_request_again_changes_nothing(world: World) -> None:
    first = await world.upload(tags=["birds"], title="Birds", metadata={"team": "a"})
    ids, embedded = world.chunk_ids(), world.embedder.embedded
    assert not first.unchanged and world.record().metadata[CHUNKING_KEY] == "auto size=default overlap=default"
    again = await world.upload(tags=["birds"], title="Birds", metadata={"team": "a"})
    assert again.unchanged and again.chunks_written == 0
    assert world.chunk_ids() == ids and world.embedder.embedded == embedded
    # a request that names the defaults, or gives less (no title, no tags, no metadata), asks for the same
    assert (await world.upload(chunking_strategy="AUTO")).unchanged and world.record().tags == ["birds"]


@pytest.mark.parametrize(
    "changed",
    [
        {"chunking_strategy": "sentence"},
        {"chunk_size_tokens": 40},
        {"chunk_overlap_tokens": 8, "chunk_size_tokens": 128},
        {"title": "Waterfowl"},
        {"metadata": {"team": "b"}},
        {"metadata": {"team": "a", "region": "north"}},
    ],
)
async def test_another_chunking_title_or_metadata_ingests_the_same_bytes_again(
    world: World, changed: dict[str, Any]
) -> None:
    await world.upload(metadata={"team": "a"})
    ids, embedded = world.chunk_ids(), world.embedder.embedded
    again = await world.upload(**{"metadata": {"team": "a"}, **changed})
    assert not again.unchanged and again.chunks_written == again.record.chunk_count > 0
    assert world.chunk_ids().isdisjoint(ids) and world.embedder.embedded > embedded  # the old chunks are gone
    record = world.record()
    assert record.metadata[CHUNKING_KEY] == chunking_request(DocumentSpecInput(**{"metadata": {}, **changed}))
    if "chunking_strategy" in changed:
        assert record.chunker == changed["chunking_strategy"]
    if "title" in changed:
        assert record.title == changed["title"]
    for key, value in changed.get("metadata", {}).items():
        assert record.metadata[key] == value
    # and asked once more the same way, nothing changes
    assert (await world.upload(**{"metadata": {"team": "a"}, **changed})).unchanged


async def test_new_tags_on_the_same_bytes_are_applied_without_embedding(world: World) -> None:
    await world.upload(tags=["birds"])
    ids, embedded = world.chunk_ids(), world.embedder.embedded
    again = await world.upload(tags=["waterfowl", "lake"])
    assert again.unchanged and again.record.tags == ["waterfowl", "lake"] == world.record().tags
    assert world.chunk_ids() == ids and world.embedder.embedded == embedded
    tagged = world.chunks.query_chunks(f.and_(f.eq(s.DOCUMENT_ID, "d"), f.contains_any(s.TAGS, ["lake"])), limit=1000)
    assert {c.chunk_id for c in tagged} == ids


def test_a_document_stored_before_the_chunking_was_recorded() -> None:
    """Only its strategy is known: the same strategy with default sizes is the same request."""
    legacy = DocumentRecord("t", "d", chunker="auto", title="T", metadata={"team": "a"})
    assert reingest_reason(legacy, DocumentSpecInput()) == ""
    assert reingest_reason(legacy, DocumentSpecInput(title="T", metadata={"team": "a"})) == ""
    assert "chunking" in reingest_reason(legacy, DocumentSpecInput(chunking_strategy="sentence"))
    assert "chunking" in reingest_reason(legacy, DocumentSpecInput(chunk_size_tokens=256))
    assert reingest_reason(legacy, DocumentSpecInput(title="U")) == "another title"
    assert reingest_reason(legacy, DocumentSpecInput(metadata={"team": "b"})) == "other metadata (team)"
