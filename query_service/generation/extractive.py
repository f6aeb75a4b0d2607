"""The local last resort: answers with the sources' own best sentences, cited as [n].

Sentences of all numbered sources are scored against the question with BM25 over content
words (sentences are the documents), scaled by the share of question words they cover; ties
go to the better-ranked source, then the earlier sentence. The best few form the answer,
each followed by its citation. When no sentence shares a content word with the question the
answer says the sources do not contain it. Nothing here can fail.

The answer is whole before its first token, so it streams a sentence at a time: each token is
a message of the Ask stream, and word by word an answer of three sentences cost the service about
seventy of them.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections import Counter
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from query_service.context import ContextSource, split_sentences, terms
from query_service.generation.base import (
    FinishReason,
    GenerationRequest,
    GeneratorEvent,
    TokenEvent,
    UsageReport,
)

NOT_FOUND_ANSWER = "The sources do not contain the answer to this question."
NO_SOURCES_ANSWER = "No sources were found for this question, so it cannot be answered from the documents."
_CITATION_LIKE = re.compile(r"\s*\[\s*\d+(?:\s*[-–,;]\s*\d+)*\s*\]")
_K1, _B = 1.2, 0.75
_MIN_WORDS = 6  # shorter pieces without a full stop are headings or labels


@dataclass(frozen=True)
class _Sentence:
    source_number: int
    position: int
    text: str
    terms: tuple[str, ...]


def _question_of(request: GenerationRequest) -> str:
    if request.question:
        return request.question
    users = [m.content for m in request.messages if m.role == "user"]
    return users[-1] if users else ""


def _sentences(sources: Sequence[ContextSource]) -> list[_Sentence]:
    out = []
    for source in sources:
        for position, sentence in enumerate(split_sentences(source.text)):
            clean = " ".join(_CITATION_LIKE.sub("", sentence).split())
            if _is_statement(clean):
                out.append(_Sentence(source.number, position, clean, tuple(terms(clean))))
    return out


def _is_statement(text: str) -> bool:
    """A sentence worth quoting: not a bare heading, label or fragment."""
    words = text.split()
    return len(words) >= _MIN_WORDS or (len(words) >= 3 and text[-1:] in ".!?")


def score_sentences(question: str, sentences: Sequence[_Sentence]) -> list[tuple[float, _Sentence]]:
    """(score, sentence) best first; score 0 for sentences sharing no question word."""
    wanted = set(terms(question))
    if not sentences:
        return []
    n = len(sentences)
    avg_len = sum(len(s.terms) for s in sentences) / n or 1.0
    df = Counter(t for s in sentences for t in set(s.terms))
    scored = []
    for sentence in sentences:
        tf = Counter(sentence.terms)
        norm = _K1 * (1 - _B + _B * len(sentence.terms) / avg_len)
        bm25 = sum(
            math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) * tf[t] * (_K1 + 1) / (tf[t] + norm)
            for t in wanted
            if tf[t]
        )
        coverage = len(wanted & set(sentence.terms)) / len(wanted) if wanted else 0.0
        scored.append((bm25 * (0.5 + 0.5 * coverage), sentence))
    scored.sort(key=lambda item: (-item[0], item[1].source_number, item[1].position))
    return scored


def _cite(sentence: _Sentence) -> str:
    text, marker = sentence.text, f" [{sentence.source_number}]"
    if text[-1] in ".!?":
        return text[:-1] + marker + text[-1]
    return text + marker + "."


class ExtractiveGenerator:
    """Answers from the sources' sentences; streams a sentence at a time."""

    name = "extractive"

    def __init__(self, max_sentences: int = 3, words_per_token: float = 0.75) -> None:
        self._max_sentences = max_sentences
        self._words_per_token = words_per_token

    def compose(self, request: GenerationRequest) -> tuple[str, FinishReason]:
        """(answer, finish_reason) for a request."""
        pieces, finish = self._pieces(request)
        return "".join(pieces), finish

    def _pieces(self, request: GenerationRequest) -> tuple[list[str], FinishReason]:
        """The answer as the pieces it streams (a sentence each, with its citation; each after the
        first led by a space), and its finish_reason."""
        if not request.sources:
            return [NO_SOURCES_ANSWER], "stop"
        ranked = score_sentences(_question_of(request), _sentences(request.sources))
        chosen: list[str] = []
        seen: set[str] = set()
        for score, sentence in ranked:
            if score <= 0 or len(chosen) >= self._max_sentences:
                break
            key = sentence.text.lower()
            if key not in seen:
                seen.add(key)
                chosen.append(_cite(sentence))
        if not chosen:
            return [NOT_FOUND_ANSWER], "stop"
        return self._limit(chosen, request.max_tokens)

    def _limit(self, chosen: list[str], max_tokens: int) -> tuple[list[str], FinishReason]:
        max_words = max(1, int(max_tokens * self._words_per_token)) if max_tokens > 0 else 10**9
        kept: list[str] = []
        words = 0
        for sentence in chosen:
            count = len(sentence.split())
            if words + count > max_words:
                if not kept:
                    return [" ".join(sentence.split()[:max_words])], "length"
                break
            kept.append(sentence if not kept else " " + sentence)
            words += count
        return kept, "stop"

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[GeneratorEvent, None]:
        pieces, finish = self._pieces(request)
        for piece in pieces:
            yield TokenEvent(piece)
            await asyncio.sleep(0)  # a cancellation point between sentences
        yield UsageReport(finish_reason=finish, prompt_tokens=0, completion_tokens=None)
