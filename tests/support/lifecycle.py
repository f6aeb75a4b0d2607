"""The world of the document-lifecycle tests (tests/integration/lifecycle): a real ingest service over
gRPC on given stores, an embedder slowed down so that an ingestion can be interrupted at many moments,
and the steps the tests share (upload, wait, look at the stored state)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import numpy as np
from google.protobuf import field_mask_pb2

from ingest_service.app import IngestComponents
from ragrpc.config import Settings
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.testing import HashingEmbedder
from ragrpc.testing.invariants import check_store
from ragrpc.v1 import ingest_pb2

TENANT = "default"
TEXT = " ".join(f"Sentence {i} says that the heron number {i} waits by the water." for i in range(160))
TEXT_V2 = " ".join(f"Line {i} tells that the crane number {i} flies over the marsh." for i in range(160))


class SlowEmbedder(HashingEmbedder):
    """The hashing embedder with a pause per model call, as a real model has."""

    def __init__(self, pause_s: float) -> None:
        super().__init__(dimension=64)
        self.pause_s = pause_s

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        time.sleep(self.pause_s)
        return super().embed_documents(texts)


@dataclasses.dataclass
class World:
    settings: Settings
    embedder: SlowEmbedder
    chunks: Any
    registry: Any
    ingest: IngestComponents | None = None
    stub: Any = None

    def chunk_rows(self, document_id: str) -> int:
        expr = f.and_(f.eq(s.TENANT, TENANT), f.eq(s.DOCUMENT_ID, document_id))
        return sum(len(page) for page in self.chunks.scan_chunks(expr))

    def assert_consistent(self) -> None:
        report = check_store(self.chunks, self.registry, tenant=TENANT)
        assert not report.problems, report.summary() + "\n" + "\n".join(report.problems[:20])


def upload_messages(document_id: str, text: str, *, pieces: int = 1) -> list[ingest_pb2.UploadDocumentRequest]:
    data = text.encode()
    step = max(1, len(data) // pieces + 1)
    header = ingest_pb2.DocumentSpec(document_id=document_id, file_name=f"{document_id}.txt")
    return [ingest_pb2.UploadDocumentRequest(header=header)] + [
        ingest_pb2.UploadDocumentRequest(data=data[i : i + step]) for i in range(0, len(data), step)
    ]


async def upload_document(world: World, document_id: str, text: str = TEXT, **kwargs: Any) -> Any:
    return await world.stub.UploadDocument(iter(upload_messages(document_id, text)), **kwargs)


async def stored_state(world: World, document_id: str) -> Any:
    return await asyncio.to_thread(world.registry.get, TENANT, document_id)


async def until(predicate: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def true_when(value: bool) -> bool:
    return value


async def settled(world: World) -> None:
    """Until no ingestion runs and every admission slot is back."""
    assert world.ingest is not None
    ingest = world.ingest

    async def idle() -> bool:
        return ingest.ingestions.running == 0 and ingest.gate.pending == 0

    await until(idle)


async def ingestion_time(world: World) -> float:
    started = time.monotonic()
    await upload_document(world, "probe")
    elapsed = time.monotonic() - started
    await world.stub.DeleteDocument(ingest_pb2.DeleteDocumentRequest(document_id="probe"))
    return elapsed


def update_request(document_id: str, tags: list[str], etag: str = "") -> ingest_pb2.UpdateDocumentRequest:
    return ingest_pb2.UpdateDocumentRequest(
        document=ingest_pb2.Document(document_id=document_id, tags=tags, etag=etag),
        update_mask=field_mask_pb2.FieldMask(paths=["tags"]),
    )
