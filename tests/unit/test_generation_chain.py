"""FallbackChain + OpenAiChatGenerator against a real OpenAI-compatible HTTP server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from itertools import count

import pytest

from query_service.context import ContextSource
from query_service.generation import (
    ChatMessage,
    EndpointConfig,
    ExtractiveGenerator,
    FallbackChain,
    GenerationDone,
    GenerationFailure,
    GenerationRequest,
    RetractionEvent,
    TokenEvent,
    build_generator_chain,
    parse_endpoints,
)
from query_service.generation.openai_chat import OpenAiChatGenerator
from ragrpc.models import ChunkRecord, ScoredChunk
from ragrpc.tokens import TiktokenCounter
from tests.support.chat_server import Behaviour, ChatServer

GOOD_TEXT = "The Eiffel Tower was completed in 1889 [1]."
_names = count()


@pytest.fixture(scope="module")
def server() -> ChatServer:
    with ChatServer() as chat_server:
        yield chat_server


@pytest.fixture(scope="module")
def counter() -> TiktokenCounter:
    return TiktokenCounter()


def model(server: ChatServer, behaviour: Behaviour) -> str:
    """A fresh model name that the server answers with `behaviour`."""
    name = f"{behaviour.kind}-{next(_names)}"
    server.set_behaviour(name, behaviour)
    return name


def source(number: int, text: str) -> ContextSource:
    chunk = ChunkRecord(
        chunk_id=f"c{number}",
        document_id=f"d{number}",
        tenant="t",
        collection="c",
        generation="g",
        text=text,
        vector=[],
        chunk_index=0,
        chunker="test",
        title=f"Doc {number}",
    )
    return ContextSource(number, ScoredChunk(chunk, 1.0 / number), text, f"Doc {number}", "")


def request() -> GenerationRequest:
    sources = [
        source(1, "The Eiffel Tower was completed in 1889 for the World's Fair."),
        source(2, "It is 330 metres tall and stands in Paris."),
    ]
    messages = [ChatMessage("system", "Answer from the sources."), ChatMessage("user", "When was it built?")]
    return GenerationRequest(messages, max_tokens=100, sources=sources, question="When was the Eiffel Tower completed?")


def chain_of(server: ChatServer, counter: TiktokenCounter, *models: str, first_token_s: float = 2.0) -> FallbackChain:
    endpoints = [EndpointConfig(server.url, m, "RAGRPC_TEST_UNSET_KEY", 5.0) for m in models]
    return build_generator_chain(endpoints, first_token_timeout_s=first_token_s, counter=counter)


async def collect(chain: FallbackChain, req: GenerationRequest) -> list[tuple[float, object]]:
    try:
        return [(time.monotonic(), event) async for event in chain.run(req)]
    finally:
        await chain.aclose()


def answer_after_last_retraction(events: list[tuple[float, object]]) -> str:
    pieces: list[str] = []
    for _, event in events:
        if isinstance(event, RetractionEvent):
            pieces = []
        elif isinstance(event, TokenEvent):
            pieces.append(event.text)
    return "".join(pieces)


def done_of(events: list[tuple[float, object]]) -> GenerationDone:
    last = events[-1][1]
    assert isinstance(last, GenerationDone)
    assert sum(isinstance(e, GenerationDone) for _, e in events) == 1
    return last


async def test_tokens_arrive_while_the_server_is_still_streaming(server, counter):
    slow = model(server, Behaviour.stream(GOOD_TEXT, delay_s=0.3))
    events = await collect(chain_of(server, counter, slow), request())
    done = done_of(events)
    record = next(r for r in server.requests if r.model == slow)
    first_token_at = next(t for t, e in events if isinstance(e, TokenEvent))
    assert record.finished_at is not None
    assert first_token_at < record.finished_at - 0.3  # 8 tokens x 0.3 s: the first came early
    assert done.model == slow and done.finish_reason == "stop"
    assert done.answer == GOOD_TEXT == answer_after_last_retraction(events)
    assert done.completion_tokens == 8  # usage as the server reported it (stream_options)
    assert record.body["stream_options"] == {"include_usage": True}
    assert not any(isinstance(e, RetractionEvent) for _, e in events)


@pytest.mark.parametrize(
    "failing",
    [
        Behaviour.error(500),
        Behaviour.error(503),
        Behaviour.error(429),
        Behaviour.error(400),
        Behaviour.hang(),
        Behaviour.malformed(0),
        Behaviour.die(0),
        Behaviour.stream(""),
    ],
    ids=["http500", "http503", "http429", "http400", "hang", "malformed", "die", "empty"],
)
async def test_failure_before_any_token_moves_on_silently(server, counter, failing):
    bad = model(server, failing)
    good = model(server, Behaviour.stream(GOOD_TEXT, delay_s=0.0))
    started = time.monotonic()
    events = await collect(chain_of(server, counter, bad, good, first_token_s=0.5), request())
    assert not any(isinstance(e, RetractionEvent) for _, e in events)
    done = done_of(events)
    assert done.model == good and done.answer == GOOD_TEXT
    assert time.monotonic() - started < 4.0
    seen = [r.model for r in server.requests if r.model in (bad, good)]
    assert seen[-1] == good and set(seen[:-1]) == {bad}  # a 400 is retried once without stream_options


@pytest.mark.parametrize(
    "failing",
    [Behaviour.die(3), Behaviour.malformed(2), Behaviour.stream("The tower is in Rome [9].")],
    ids=["die-after-3", "malformed-after-2", "cites-9"],
)
async def test_failure_after_tokens_retracts_then_the_next_entry_answers(server, counter, failing):
    bad = model(server, failing)
    good = model(server, Behaviour.stream(GOOD_TEXT, delay_s=0.0))
    events = await collect(chain_of(server, counter, bad, good), request())
    kinds = [type(e).__name__ for _, e in events]
    retraction_at = kinds.index("RetractionEvent")
    assert kinds.count("RetractionEvent") == 1
    assert retraction_at >= 2 and set(kinds[:retraction_at]) == {"TokenEvent"}
    retraction = events[retraction_at][1]
    assert isinstance(retraction, RetractionEvent) and retraction.model == bad
    assert "tokens" in retraction.reason or "[9]" in retraction.reason
    done = done_of(events)
    assert done.model == good
    assert done.answer == GOOD_TEXT == answer_after_last_retraction(events)


async def test_citing_a_missing_source_names_it_in_the_retraction(server, counter):
    bad = model(server, Behaviour.stream("The tower is in Rome [9]."))
    events = await collect(chain_of(server, counter, bad), request())
    retraction = next(e for _, e in events if isinstance(e, RetractionEvent))
    assert "[9]" in retraction.reason and "2 source" in retraction.reason


async def test_every_endpoint_failing_ends_with_the_extractive_answer(server, counter):
    models = [model(server, b) for b in (Behaviour.error(500), Behaviour.hang(), Behaviour.die(2))]
    events = await collect(chain_of(server, counter, *models, first_token_s=0.5), request())
    kinds = [type(e).__name__ for _, e in events]
    assert kinds.count("RetractionEvent") == 1  # only the one that had sent tokens
    done = done_of(events)
    assert done.model == "extractive"
    assert "completed in 1889" in done.answer and done.answer.endswith("[1].")
    assert done.answer == answer_after_last_retraction(events)
    assert done.prompt_tokens == 0 and done.completion_tokens == counter.count(done.answer)


async def test_server_rejecting_stream_options_is_retried_without_and_usage_counted(server, counter):
    picky = model(server, Behaviour.stream(GOOD_TEXT, delay_s=0.0, reject_stream_options=True))
    req = request()
    events = await collect(chain_of(server, counter, picky), req)
    done = done_of(events)
    assert done.model == picky and done.answer == GOOD_TEXT
    bodies = [r.body for r in server.requests if r.model == picky]
    assert "stream_options" in bodies[0] and "stream_options" not in bodies[1]
    assert done.completion_tokens == counter.count(GOOD_TEXT)
    assert done.prompt_tokens > counter.count("Answer from the sources. When was it built?")


async def test_length_finish_reason_is_reported(server, counter):
    cut = model(server, Behaviour.stream("The Eiffel Tower was [1]", finish_reason="length"))
    done = done_of(await collect(chain_of(server, counter, cut), request()))
    assert done.finish_reason == "length" and done.model == cut


async def _consume(events: AsyncIterator[object], got: list[object], enough: asyncio.Event) -> None:
    async for event in events:
        got.append(event)
        if len(got) >= 2:
            enough.set()


async def test_cancelling_the_consumer_closes_the_upstream_request_within_a_second(server, counter):
    slow = model(server, Behaviour.stream(" ".join(["word"] * 200), delay_s=0.2))
    chain = chain_of(server, counter, slow)
    got: list[object] = []
    enough = asyncio.Event()
    task = asyncio.create_task(_consume(chain.run(request()), got, enough))
    await asyncio.wait_for(enough.wait(), 5)
    cancelled_at = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert server.wait_until(lambda rs: any(r.model == slow and r.disconnected_at for r in rs), 2.0)
    record = next(r for r in server.requests if r.model == slow)
    assert record.finished_at is None
    assert record.disconnected_at - cancelled_at < 1.0
    assert record.tokens_sent < 20
    await chain.aclose()


async def test_aclose_of_the_run_closes_the_upstream_request(server, counter):
    slow = model(server, Behaviour.stream(" ".join(["word"] * 200), delay_s=0.2))
    chain = chain_of(server, counter, slow)
    events = chain.run(request())
    assert isinstance(await events.__anext__(), TokenEvent)
    closed_at = time.monotonic()
    await events.aclose()
    assert server.wait_until(lambda rs: any(r.model == slow and r.disconnected_at for r in rs), 2.0)
    record = next(r for r in server.requests if r.model == slow)
    assert record.disconnected_at - closed_at < 1.0
    await chain.aclose()


class _Broken:
    """A generator with a bug: raises something that is not a GenerationFailure."""

    name = "broken"

    async def stream(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        yield TokenEvent("half an")
        raise RuntimeError("bug")


class _Refusing:
    name = "refusing"

    async def stream(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        raise GenerationFailure("HTTP 401: bad key", retriable=False)
        yield TokenEvent("never")  # pragma: no cover


async def test_non_generation_errors_and_permanent_failures_fall_through(counter):
    chain = FallbackChain([_Refusing(), _Broken()], counter=counter)
    events = [e async for e in chain.run(request())]
    assert [type(e).__name__ for e in events[:2]] == ["TokenEvent", "RetractionEvent"]
    assert events[1].model == "broken" and "RuntimeError" in events[1].reason
    assert events[-1].model == "extractive"
    assert isinstance(chain.generators[-1], ExtractiveGenerator)


async def test_timeout_before_first_token_is_bounded(server, counter):
    hang = model(server, Behaviour.hang())
    generator = OpenAiChatGenerator(server.url, hang, "RAGRPC_TEST_UNSET_KEY", 5.0, first_token_timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(GenerationFailure) as failure:
        async for _ in generator.stream(request()):
            pass
    assert failure.value.retriable and "0.3s" in failure.value.reason
    assert time.monotonic() - started < 2.0
    assert server.wait_until(lambda rs: any(r.model == hang and r.disconnected_at for r in rs), 2.0)
    await generator.aclose()


@pytest.mark.parametrize(
    "behaviour, retriable",
    [(Behaviour.error(500), True), (Behaviour.error(429), True), (Behaviour.error(404), False)],
)
async def test_http_errors_are_classified(server, behaviour, retriable):
    generator = OpenAiChatGenerator(server.url, model(server, behaviour), "RAGRPC_TEST_UNSET_KEY", 5.0)
    with pytest.raises(GenerationFailure) as failure:
        async for _ in generator.stream(request()):
            pass
    assert failure.value.retriable is retriable
    assert f"HTTP {behaviour.status}" in failure.value.reason
    await generator.aclose()


def test_parse_endpoints_pipe_format():
    text = "http://127.0.0.1:8080/v1|smollm2|OPENAI_API_KEY|30, https://api.openai.com/v1|gpt-4o-mini"
    assert parse_endpoints(text) == [
        EndpointConfig("http://127.0.0.1:8080/v1", "smollm2", "OPENAI_API_KEY", 30.0),
        EndpointConfig("https://api.openai.com/v1", "gpt-4o-mini", "OPENAI_API_KEY", 30.0),
    ]


def test_parse_endpoints_json_format_and_empty():
    text = '[{"base_url": "http://localhost:11434/v1", "model": "llama3.2", "api_key_env": "K", "timeout_s": 60}]'
    assert parse_endpoints(text) == [EndpointConfig("http://localhost:11434/v1", "llama3.2", "K", 60.0)]
    assert parse_endpoints("") == [] and parse_endpoints("  ") == []


@pytest.mark.parametrize(
    "bad",
    [
        "localhost:8080|m",
        "http://x/v1",
        "http://x/v1|m|K|soon",
        "http://x/v1|m|K|-1",
        "[{",
        '{"a": 1}',
        "http://x/v1||K",
    ],
)
def test_parse_endpoints_rejects_malformed_entries(bad):
    with pytest.raises(ValueError, match="LLM endpoint"):
        parse_endpoints(bad)


def test_build_generator_chain_keeps_order_and_ends_with_extractive(counter):
    chain = build_generator_chain(parse_endpoints("http://a/v1|m1,http://b/v1|m2|K|3"), counter=counter)
    names = [g.name for g in chain.generators]
    assert names == ["m1", "m2", "extractive"]
