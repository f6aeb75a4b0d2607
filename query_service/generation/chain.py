"""FallbackChain: tries generators in order until one produces a valid answer.

Events of run(request):

    TokenEvent*  [RetractionEvent  TokenEvent*]*  GenerationDone

Tokens are passed on as they arrive. When an entry fails (GenerationFailure, or any other
exception) before sending a token, the chain moves on silently (the failure is logged).
When it fails after tokens went out, or its finished answer is invalid (empty, or citing a
source number that was not given), a RetractionEvent voids what was sent and the next
entry answers from scratch: two answers are never spliced. The last entry is always the
ExtractiveGenerator, whose answer is accepted as it is.

Closing the run (aclose, or cancelling the task consuming it) closes the running
generator's stream at once, which closes its upstream request.

A run is one `generate` span (ragrpc.tracing): the request's max_tokens and temperature, a
`generator_failed` event per entry that failed (model, problem), and, once answered, the
answering model and endpoint, token usage, finish reason and how many entries failed first.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from query_service.generation.base import (
    ChainEvent,
    GenerationDone,
    GenerationFailure,
    GenerationRequest,
    Generator,
    RetractionEvent,
    TokenEvent,
    UsageReport,
    count_prompt_tokens,
)
from query_service.generation.citations import validate
from query_service.generation.extractive import ExtractiveGenerator
from ragrpc.errors import InternalError
from ragrpc.tokens import TiktokenCounter, TokenCounter
from ragrpc.tracing import NoopTracer, SpanHandle, Tracer

log = logging.getLogger(__name__)


@dataclass
class _Attempt:
    pieces: list[str] = field(default_factory=list)
    usage: UsageReport | None = None

    @property
    def answer(self) -> str:
        return "".join(self.pieces)


class FallbackChain:
    """Generators in order of preference; an ExtractiveGenerator is appended when the
    list does not already end with one. `counter` counts usage the backend did not report
    (a cl100k_base TiktokenCounter when None)."""

    def __init__(
        self, generators: Sequence[Generator], counter: TokenCounter | None = None, tracer: Tracer | None = None
    ) -> None:
        entries = list(generators)
        if not entries or not isinstance(entries[-1], ExtractiveGenerator):
            entries.append(ExtractiveGenerator())
        self._generators: list[Generator] = entries
        self._counter = counter if counter is not None else TiktokenCounter()
        self._tracer = tracer or NoopTracer()

    @property
    def generators(self) -> list[Generator]:
        return list(self._generators)

    async def aclose(self) -> None:
        """Closes the generators that hold resources (HTTP clients)."""
        for generator in self._generators:
            close = getattr(generator, "aclose", None)
            if close is not None:
                await close()

    async def run(self, request: GenerationRequest) -> AsyncGenerator[ChainEvent, None]:
        with self._tracer.span("generate", **_request_attributes(request, len(self._generators))) as span:
            async with aclosing(self._attempts(request, span)) as events:
                async for event in events:
                    yield event

    async def _attempts(self, request: GenerationRequest, span: SpanHandle) -> AsyncGenerator[ChainEvent, None]:
        last = len(self._generators) - 1
        retractions = 0
        for index, generator in enumerate(self._generators):
            attempt = _Attempt()
            problem: str | None = None
            try:
                async with aclosing(generator.stream(request)) as events:
                    async for event in events:
                        if isinstance(event, UsageReport):
                            attempt.usage = event
                        elif isinstance(event, TokenEvent) and event.text:
                            attempt.pieces.append(event.text)
                            yield event
            except GenerationFailure as failure:
                problem = f"upstream error after {len(attempt.pieces)} tokens: {failure.reason}"
                self._log_failure(generator.name, problem, failure.retriable)
            except Exception as err:  # a broken generator must not break the answer
                problem = f"generator error after {len(attempt.pieces)} tokens: {type(err).__name__}: {err}"
                log.exception("generator %s failed", generator.name)
            if problem is None and index < last:
                invalid = validate(attempt.answer, len(request.sources))
                if invalid is not None:
                    problem = f"invalid answer: {invalid}"
                    log.warning("generator %s gave an invalid answer: %s", generator.name, invalid)
            if problem is None:
                done = self._done(generator.name, request, attempt)
                span.set(fallbacks=index, retractions=retractions, **_answer_attributes(generator, done))
                yield done
                return
            span.event("generator_failed", model=generator.name, problem=problem, tokens_sent=len(attempt.pieces))
            if attempt.pieces:
                retractions += 1
                yield RetractionEvent(model=generator.name, reason=problem)
            if index == last:
                raise InternalError(f"the last generator {generator.name} failed: {problem}")

    @staticmethod
    def _log_failure(name: str, problem: str, retriable: bool) -> None:
        log.warning("generator %s failed (%s): %s", name, "retriable" if retriable else "permanent", problem)

    def _done(self, model: str, request: GenerationRequest, attempt: _Attempt) -> GenerationDone:
        usage = attempt.usage or UsageReport()
        prompt = usage.prompt_tokens
        if prompt is None:
            prompt = count_prompt_tokens(request.messages, self._counter)
        completion = usage.completion_tokens
        if completion is None:
            completion = self._counter.count(attempt.answer)
        return GenerationDone(
            model=model,
            finish_reason=usage.finish_reason,
            prompt_tokens=prompt,
            completion_tokens=completion,
            answer=attempt.answer,
        )


def _request_attributes(request: GenerationRequest, entries: int) -> dict[str, Any]:
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.max_tokens": request.max_tokens or None,
        "gen_ai.request.temperature": request.temperature,
        "generators": entries,
        "sources": len(request.sources),
    }


def _answer_attributes(generator: Generator, done: GenerationDone) -> dict[str, Any]:
    """Semantic-convention attributes of the answer; the endpoint of an OpenAI-compatible generator."""
    base_url = getattr(generator, "base_url", None)
    endpoint = urlsplit(base_url) if isinstance(base_url, str) and base_url else None
    return {
        "gen_ai.request.model": done.model,
        "gen_ai.response.model": done.model,
        "gen_ai.response.finish_reasons": [done.finish_reason],
        "gen_ai.usage.input_tokens": done.prompt_tokens,
        "gen_ai.usage.output_tokens": done.completion_tokens,
        "server.address": endpoint.hostname if endpoint else None,
        "server.port": endpoint.port if endpoint else None,
        # no credentials or query string: scheme, host, port and path only
        "endpoint": f"{endpoint.scheme}://{endpoint.netloc.rpartition('@')[2]}{endpoint.path}" if endpoint else None,
        "extractive": isinstance(generator, ExtractiveGenerator),
    }
