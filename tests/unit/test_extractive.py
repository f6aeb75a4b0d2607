from __future__ import annotations

import pytest

from query_service.context import ContextSource
from query_service.generation.base import ChatMessage, GenerationRequest, TokenEvent, UsageReport
from query_service.generation.citations import parse_citations, validate
from query_service.generation.extractive import NO_SOURCES_ANSWER, NOT_FOUND_ANSWER, ExtractiveGenerator
from ragrpc.models import ChunkRecord, ScoredChunk


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
    )
    return ContextSource(number, ScoredChunk(chunk, 1.0), text, f"Doc {number}", "")


def req(question: str, *texts: str, max_tokens: int = 200) -> GenerationRequest:
    sources = [source(i, t) for i, t in enumerate(texts, 1)]
    return GenerationRequest([ChatMessage("user", question)], max_tokens, sources=sources, question=question)


async def run(generator: ExtractiveGenerator, request: GenerationRequest) -> tuple[list[str], UsageReport]:
    tokens: list[str] = []
    usage = None
    async for event in generator.stream(request):
        if isinstance(event, TokenEvent):
            tokens.append(event.text)
        else:
            usage = event
    assert isinstance(usage, UsageReport)
    return tokens, usage


SOURCES = (
    "The warranty covers parts for two years. Shipping is free in the EU.",
    "Returns are accepted within 30 days of delivery. Refunds take five business days.",
    "Our office is in Berlin. The team has twelve people.",
)


async def test_picks_the_relevant_sentence_and_cites_its_source():
    tokens, usage = await run(ExtractiveGenerator(), req("How long does a refund take?", *SOURCES))
    answer = "".join(tokens)
    assert answer.startswith("Refunds take five business days [2].")
    assert "Berlin" not in answer
    assert usage.finish_reason == "stop" and validate(answer, 3) is None
    assert {c.source_number for c in parse_citations(answer)} <= {1, 2, 3}


async def test_several_sentences_each_cited():
    tokens, _ = await run(ExtractiveGenerator(max_sentences=3), req("warranty returns refunds", *SOURCES))
    answer = "".join(tokens)
    assert "[1]" in answer and "[2]" in answer
    assert len(parse_citations(answer)) >= 2


async def test_says_so_when_no_source_is_relevant():
    tokens, usage = await run(ExtractiveGenerator(), req("What is the capital of Mongolia?", *SOURCES))
    assert "".join(tokens) == NOT_FOUND_ANSWER and usage.finish_reason == "stop"


async def test_no_sources_at_all():
    tokens, _ = await run(ExtractiveGenerator(), req("Anything?"))
    assert "".join(tokens) == NO_SOURCES_ANSWER


async def test_ties_go_to_the_better_ranked_source():
    same = "The meeting is on Monday."
    tokens, _ = await run(ExtractiveGenerator(max_sentences=1), req("When is the meeting?", same, same))
    assert "".join(tokens) == "The meeting is on Monday [1]."


async def test_citation_markers_inside_sources_are_not_copied():
    text = "Water boils at 100 degrees Celsius at sea level [12]."
    tokens, _ = await run(ExtractiveGenerator(), req("At what temperature does water boil?", text))
    answer = "".join(tokens)
    assert answer == "Water boils at 100 degrees Celsius at sea level [1]."
    assert validate(answer, 1) is None


async def test_falls_back_to_the_last_user_message_without_question():
    request = GenerationRequest([ChatMessage("user", "office location Berlin")], 100, sources=[source(1, SOURCES[2])])
    tokens, _ = await run(ExtractiveGenerator(), request)
    assert "Berlin [1]" in "".join(tokens)


@pytest.mark.parametrize("max_tokens, finish", [(8, "length"), (40, "stop")])
async def test_respects_max_tokens(max_tokens, finish):
    long_sentence = "Refunds for returned items usually take five to seven business days to arrive."
    tokens, usage = await run(
        ExtractiveGenerator(), req("How long do refunds take?", long_sentence, max_tokens=max_tokens)
    )
    assert usage.finish_reason == finish
    assert len("".join(tokens).split()) <= int(max_tokens * 0.75)


async def test_closing_the_stream_early_is_fine():
    stream = ExtractiveGenerator().stream(req("How long does a refund take?", *SOURCES))
    first = await stream.__anext__()
    await stream.aclose()
    assert isinstance(first, TokenEvent) and first.text == "Refunds take five business days [2]."


async def test_streams_a_sentence_a_token_and_the_tokens_join_to_the_composed_answer():
    generator = ExtractiveGenerator()
    request = req("How long is the warranty and where is the office?", *SOURCES)
    tokens, usage = await run(generator, request)
    answer, finish = generator.compose(request)
    assert "".join(tokens) == answer and usage.finish_reason == finish == "stop"
    assert sorted(t.strip() for t in tokens) == [  # a token a sentence, each with its citation
        "Our office is in Berlin [3].",
        "The warranty covers parts for two years [1].",
    ]
    assert not tokens[0].startswith(" ") and tokens[1].startswith(" ")
