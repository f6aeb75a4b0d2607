"""Ask over gRPC with a real OpenAI-compatible HTTP server as the LLM: tokens reach the gRPC
client while the model is still generating, failures fall through to the extractive
answerer, and a cancelled Ask closes the upstream request promptly."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import grpc
import pytest

from ragrpc.config import Settings
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc, retrieve_pb2, retrieve_pb2_grpc
from tests.conftest import FakeStack, running_stack
from tests.support.chat_server import Behaviour, ChatServer

DOC = b"Mallards are dabbling ducks that live near lakes and rivers across the northern hemisphere."


@pytest.fixture
def chat() -> ChatServer:
    # 0.4 s between tokens: the stream lasts seconds, so the 0.5 s margin below holds on a loaded machine
    with ChatServer(Behaviour.stream("Mallards live near lakes and rivers [1].", delay_s=0.4)) as server:
        yield server


async def _stack_with_llm(settings: Settings, chat: ChatServer, models: str = "m1"):  # type: ignore[no-untyped-def]
    endpoints = ",".join(f"{chat.url}|{m}|NO_KEY_SET|5" for m in models.split(","))
    configured = dataclasses.replace(settings, llm_endpoints=endpoints)
    return running_stack(configured, FakeStack(HashingEmbedder(), InMemoryChunkStore(), InMemoryDocumentRegistry()))


async def _ingest(address: str) -> None:
    async with grpc.aio.insecure_channel(address) as channel:

        async def messages():  # type: ignore[no-untyped-def]
            yield ingest_pb2.UploadDocumentRequest(
                header=ingest_pb2.DocumentSpec(file_name="ducks.txt", document_id="ducks")
            )
            yield ingest_pb2.UploadDocumentRequest(data=DOC)

        await ingest_pb2_grpc.IngestServiceStub(channel).UploadDocument(messages())


async def test_tokens_arrive_before_the_model_finishes(settings: Settings, chat: ChatServer) -> None:
    async with await _stack_with_llm(settings, chat) as stack:
        await _ingest(stack.ingest_address)
        async with grpc.aio.insecure_channel(stack.query_address) as channel:
            stream = retrieve_pb2_grpc.RetrieveServiceStub(channel).Ask(
                retrieve_pb2.AskRequest(query="Where do mallards live?")
            )
            first_token_at, events = None, []
            async for event in stream:
                events.append(event)
                if event.HasField("token") and first_token_at is None:
                    first_token_at = time.monotonic()
    record = chat.requests[-1]
    assert first_token_at is not None and record.finished_at is not None
    assert first_token_at < record.finished_at - 0.5  # the rest was still being generated
    final = events[-1].final
    assert final.model == "m1" and final.answer == "Mallards live near lakes and rivers [1]."
    assert [e.citation.document_id for e in events if e.HasField("citation")] == ["ducks"]


@pytest.mark.parametrize(
    "failure",
    [
        Behaviour.error(500),
        Behaviour.error(429),
        Behaviour.malformed(0),
        Behaviour.stream("See source [9]."),
        Behaviour.hang(),
    ],
    ids=["500", "429", "malformed", "bad-citation", "timeout"],
)
async def test_failures_fall_through_to_extractive(settings: Settings, chat: ChatServer, failure: Behaviour) -> None:
    chat.set_behaviour("m1", failure)
    chat.set_behaviour("m2", failure)
    async with await _stack_with_llm(dataclasses.replace(settings), chat, "m1,m2") as stack:
        await _ingest(stack.ingest_address)
        async with grpc.aio.insecure_channel(stack.query_address) as channel:
            events = [
                e
                async for e in retrieve_pb2_grpc.RetrieveServiceStub(channel).Ask(
                    retrieve_pb2.AskRequest(query="Where do mallards live?"), timeout=60
                )
            ]
    final = events[-1].final
    assert final.model == "extractive" and "[1]" in final.answer
    retractions = [e.retraction for e in events if e.HasField("retraction")]
    if failure.kind == "stream":  # tokens went out before the answer failed validation: withdrawn
        assert len(retractions) == 2 and "9" in retractions[0].reason
        answer_after = "".join(
            e.token.text
            for e in events[events.index(next(e for e in reversed(events) if e.HasField("retraction"))) :]
            if e.HasField("token")
        )
        assert answer_after == final.answer  # the final answer is not spliced with the withdrawn one
    else:  # failed before any token: moved on silently
        assert not retractions


async def test_cancel_closes_the_upstream_request(settings: Settings, chat: ChatServer) -> None:
    chat.set_behaviour("m1", Behaviour.stream(" ".join(["word"] * 200), delay_s=0.1))
    async with await _stack_with_llm(settings, chat) as stack:
        await _ingest(stack.ingest_address)
        async with grpc.aio.insecure_channel(stack.query_address) as channel:
            call = retrieve_pb2_grpc.RetrieveServiceStub(channel).Ask(retrieve_pb2.AskRequest(query="mallards"))
            async for event in call:
                if event.HasField("token"):
                    break
            cancelled_at = time.monotonic()
            call.cancel()
            assert await asyncio.to_thread(chat.wait_until, lambda reqs: reqs and reqs[-1].disconnected_at, 3.0)
    record = chat.requests[-1]
    assert record.disconnected_at - cancelled_at < 1.0
    assert record.tokens_sent < 200
