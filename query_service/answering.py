"""Ask: retrieve -> assemble context under the token budget -> prompt template -> generator
chain -> stream tokens -> citations -> final message.

Events (domain objects the servicer converts one-to-one):

    SourcesReady (the numbered sources)  TokenEvent*  [RetractionEvent TokenEvent*]*
    CitationFound*  AnswerFinished

Spans (ragrpc.tracing): the retrieval's stages, then `context` (budget, tokens used, sources
and chunks kept, candidates dropped), then the chain's `generate`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from concurrent.futures import Executor
from contextlib import aclosing
from dataclasses import dataclass, field

from query_service.context import ContextSource
from query_service.generation.base import ChatMessage, GenerationDone, RetractionEvent, TokenEvent
from query_service.generation.chain import FallbackChain
from query_service.generation.citations import parse_citations
from query_service.prompt_templates import BuiltPrompt, PromptBuilder
from query_service.retrieval import RetrievalPipeline
from query_service.retrieval_types import RetrievalQuery, RetrievalResult
from ragrpc import errors
from ragrpc.models import ScoredChunk
from ragrpc.tracing import NoopTracer, Tracer, in_current_context


@dataclass
class AskQuery:
    retrieval: RetrievalQuery
    template: str = "default"
    history: list[ChatMessage] = field(default_factory=list)
    max_answer_tokens: int = 0
    token_budget: int = 0
    temperature: float | None = None


@dataclass
class SourcesReady:
    sources: list[ContextSource]  # numbered from 1, in prompt order
    score_kind: str


@dataclass
class CitationFound:
    source: ContextSource
    answer_start: int
    answer_end: int


@dataclass
class AnswerFinished:
    finish_reason: str  # stop | length | no_sources
    model: str
    prompt_tokens: int
    completion_tokens: int
    answer: str
    timings: list[tuple[str, float]]
    retrieval: RetrievalResult


AskEvent = SourcesReady | TokenEvent | RetractionEvent | CitationFound | AnswerFinished


class AnswerService:
    def __init__(
        self,
        *,
        retrieval: RetrievalPipeline,
        prompts: PromptBuilder,
        chain: FallbackChain,
        executor: Executor,
        observer: Callable[[AnswerFinished], None] | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self._tracer = tracer or NoopTracer()
        self._retrieval = retrieval
        self._observer = observer
        self._prompts = prompts
        self._chain = chain
        self._executor = executor

    async def ask(self, query: AskQuery) -> AsyncGenerator[AskEvent, None]:
        started = time.perf_counter()
        result = await self._retrieval.retrieve(query.retrieval)
        context_started = time.perf_counter()
        with self._tracer.span("context", hits=len(result.hits), template=query.template or "default") as span:
            built = await self._build_prompt(query, result)
            span.set(**_context_attributes(built))
        timings = [*_retrieval_timings(result), ("context", _ms_since(context_started))]
        sources = list(built.context.sources)
        yield SourcesReady(sources, result.score_kind)
        generate_started = time.perf_counter()
        first_token: float | None = None
        done: GenerationDone | None = None
        async with aclosing(self._chain.run(built.request(query.temperature))) as events:
            async for event in events:
                if isinstance(event, GenerationDone):
                    done = event
                    continue
                if isinstance(event, TokenEvent) and first_token is None:
                    first_token = _ms_since(started)
                yield event
        if done is None:
            raise errors.InternalError("the generator chain ended without a final event")
        for citation in parse_citations(done.answer):
            if 1 <= citation.source_number <= len(sources):
                yield CitationFound(sources[citation.source_number - 1], citation.answer_start, citation.answer_end)
        timings += [
            ("generate", _ms_since(generate_started)),
            ("time_to_first_token", first_token if first_token is not None else _ms_since(started)),
            ("total", _ms_since(started)),
        ]
        reason = "no_sources" if not sources else done.finish_reason
        finished = AnswerFinished(
            reason, done.model, done.prompt_tokens, done.completion_tokens, done.answer, timings, result
        )
        if self._observer is not None:
            self._observer(finished)
        yield finished

    async def _build_prompt(self, query: AskQuery, result: RetrievalResult) -> BuiltPrompt:
        def build() -> BuiltPrompt:
            return self._prompts.build(
                query.retrieval.text,
                result.hits,
                template=query.template or "default",
                history=query.history,
                budget_tokens=query.token_budget or None,
                max_answer_tokens=query.max_answer_tokens or None,
            )

        return await asyncio.get_running_loop().run_in_executor(self._executor, in_current_context(build))


def _context_attributes(built: BuiltPrompt) -> dict[str, int]:
    sources = built.context.sources
    return {
        "budget_tokens": built.budget_tokens,
        "answer_reserve_tokens": built.max_answer_tokens,
        "tokens": built.context.tokens,  # the sources' text
        "prompt_tokens": built.prompt_tokens,  # the whole prompt: instructions, history, sources, question
        "sources": len(sources),
        "chunks": sum(len(s.chunk_ids) or 1 for s in sources),
        "compressed": sum(1 for s in sources if s.compressed),
        "dropped": built.context.dropped,
        "history_kept": built.history_kept,
    }


def _ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0


def _retrieval_timings(result: RetrievalResult) -> Sequence[tuple[str, float]]:
    return [(f"retrieval.{name}" if name != "total" else "retrieval", ms) for name, ms in result.timings]


def sources_as_hits(sources: Sequence[ContextSource]) -> list[ScoredChunk]:
    return [s.hit for s in sources]
