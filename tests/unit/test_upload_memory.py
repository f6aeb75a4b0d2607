"""What bounds the memory of many large uploads: the spool (to disk past a threshold, hashed on
the way in) and the byte budget of extraction (first come, first served; a document larger than
the budget runs alone; cancellation gives its share back)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib

import grpc
import pytest

from ingest_service.byte_budget import ByteBudget
from ingest_service.requests import SpooledUpload
from ragrpc.config import Settings
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc
from tests.conftest import FakeStack, running_stack


def test_an_upload_past_the_threshold_is_spooled_to_disk_and_read_back_whole() -> None:
    upload = SpooledUpload(memory_limit=1000)
    pieces = [bytes([i]) * 300 for i in range(10)]
    for piece in pieces[:3]:
        upload.write(piece)
    assert not upload.on_disk  # 900 bytes: still in memory
    for piece in pieces[3:]:
        upload.write(piece)
    assert upload.on_disk and upload.size == 3000
    assert upload.read() == b"".join(pieces)
    assert upload.sha256 == hashlib.sha256(b"".join(pieces)).hexdigest()
    upload.close()


async def test_the_budget_admits_in_order_and_a_large_document_alone() -> None:
    budget = ByteBudget(100)
    order: list[str] = []
    release = {name: asyncio.Event() for name in ("a", "b", "big", "c")}

    async def hold(name: str, size: int) -> None:
        async with budget.hold(size):
            order.append(name)
            await release[name].wait()

    tasks = [asyncio.create_task(hold("a", 60))]
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(hold("big", 500)))  # larger than the budget: waits to run alone
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(hold("c", 10)))  # would fit now, but waits its turn behind "big"
    await asyncio.sleep(0.01)
    assert order == ["a"]
    release["a"].set()
    await asyncio.sleep(0.01)
    assert order == ["a", "big"] and budget.used == 500
    release["big"].set()
    await asyncio.sleep(0.01)
    assert order == ["a", "big", "c"]
    release["c"].set()
    await asyncio.gather(*tasks)
    assert budget.used == 0


async def test_a_cancelled_waiter_gives_its_turn_back() -> None:
    budget = ByteBudget(100)
    entered = asyncio.Event()
    release = asyncio.Event()

    async def holder() -> None:
        async with budget.hold(90):
            entered.set()
            await release.wait()

    first = asyncio.create_task(holder())
    await entered.wait()
    waiting = asyncio.create_task(budget.hold(50).__aenter__())
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    release.set()
    await first
    assert budget.used == 0
    async with budget.hold(100):
        assert budget.used == 100


async def test_an_upload_spooled_to_disk_is_ingested_like_any_other(settings: Settings, fake_stores: FakeStack) -> None:
    small_spool = dataclasses.replace(settings, upload_memory_bytes=2048)
    text = " ".join(f"Paragraph {i} describes the lighthouse keeper's log entry {i}." for i in range(200)).encode()
    assert len(text) > 4 * 2048
    async with running_stack(small_spool, fake_stores) as stack:
        async with grpc.aio.insecure_channel(stack.ingest_address) as channel:
            stub = ingest_pb2_grpc.IngestServiceStub(channel)
            header = ingest_pb2.DocumentSpec(document_id="log", file_name="log.txt")
            messages = [ingest_pb2.UploadDocumentRequest(header=header)] + [
                ingest_pb2.UploadDocumentRequest(data=text[i : i + 1000]) for i in range(0, len(text), 1000)
            ]
            response = await stub.UploadDocument(iter(messages))
    assert response.document.state == ingest_pb2.DOCUMENT_STATE_ACTIVE
    assert response.document.content_hash == hashlib.sha256(text).hexdigest()
    assert response.document.size_bytes == len(text) and response.document.chunk_count > 1


async def test_spooled_disk_writes_and_large_pieces_leave_the_event_loop(
    settings: Settings, fake_stores: FakeStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once an upload is on disk, every write (and its hashing) runs in the spool threads, as does a
    piece over 64 KiB; only small pieces in memory are copied on the event loop."""
    import threading

    from ingest_service.requests import SpooledUpload

    writes: list[tuple[int, bool, str]] = []
    original = SpooledUpload.write

    def recording(self: SpooledUpload, data: bytes) -> None:
        writes.append((len(data), self.on_disk, threading.current_thread().name))
        original(self, data)

    monkeypatch.setattr(SpooledUpload, "write", recording)
    small_spool = dataclasses.replace(settings, upload_memory_bytes=4096)
    text = (" ".join(f"Line {i} of the keeper's log." for i in range(20000))).encode()
    pieces = [
        text[:1000],
        text[1000:2000],
        text[2000 : 2000 + (100 << 10)],
        *(text[i : i + 1000] for i in range(2000 + (100 << 10), len(text), 1000)),
    ]
    async with running_stack(small_spool, fake_stores) as stack:
        async with grpc.aio.insecure_channel(stack.ingest_address) as channel:
            stub = ingest_pb2_grpc.IngestServiceStub(channel)
            header = ingest_pb2.DocumentSpec(document_id="log", file_name="log.txt")
            messages = [ingest_pb2.UploadDocumentRequest(header=header)] + [
                ingest_pb2.UploadDocumentRequest(data=piece) for piece in pieces
            ]
            response = await stub.UploadDocument(iter(messages))
    assert response.document.content_hash == hashlib.sha256(text).hexdigest()
    loop_thread = threading.current_thread().name
    assert [thread == loop_thread for _, _, thread in writes[:2]] == [True, True]  # small, in memory
    assert all(thread.startswith("upload-spool") for _, _, thread in writes[2:])  # large, then on disk
