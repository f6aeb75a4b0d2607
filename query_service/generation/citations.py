"""Citation markers in answers: [n], [n, m], [n; m], [n-m] and runs like [n][m].

parse_citations(answer) gives one CitationSpan per (source number, sentence) pair, in the
order the markers appear; the span is the sentence that contains the marker (character
offsets into the answer, end exclusive). A marker that follows the sentence's final
period ("... in 1889. [2]") belongs to that sentence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from query_service.context import sentence_spans

_MARKER = re.compile(r"\[\s*(\d+(?:\s*[-–,;]\s*\d+)*)\s*\](?!\()")
_PART = re.compile(r"(\d+)\s*[-–]\s*(\d+)|(\d+)")
_MAX_RANGE = 50


@dataclass(frozen=True)
class CitationSpan:
    source_number: int
    answer_start: int
    answer_end: int


def _numbers(inner: str) -> list[int]:
    out: list[int] = []
    for m in _PART.finditer(inner):
        if m.group(3) is not None:
            out.append(int(m.group(3)))
            continue
        low, high = int(m.group(1)), int(m.group(2))
        if low <= high and high - low <= _MAX_RANGE:
            out.extend(range(low, high + 1))
        else:
            out.extend((low, high))
    return out


def cited_numbers(answer: str) -> list[int]:
    """All source numbers cited, in order of first appearance."""
    seen: dict[int, None] = {}
    for m in _MARKER.finditer(answer):
        for number in _numbers(m.group(1)):
            seen.setdefault(number, None)
    return list(seen)


def parse_citations(answer: str) -> list[CitationSpan]:
    spans = sentence_spans(answer)
    out: list[CitationSpan] = []
    seen: set[CitationSpan] = set()
    for m in _MARKER.finditer(answer):
        start, end = next(((a, b) for a, b in spans if a <= m.start() < b), (m.start(), m.end()))
        for number in _numbers(m.group(1)):
            span = CitationSpan(number, start, end)
            if span not in seen:
                seen.add(span)
                out.append(span)
    return out


def validate(answer: str, n_sources: int) -> str | None:
    """Why the answer is unusable (empty, or cites a source that does not exist), else None."""
    if not answer.strip():
        return "empty answer"
    bad = [n for n in cited_numbers(answer) if n < 1 or n > n_sources]
    if bad:
        listed = ", ".join(f"[{n}]" for n in bad)
        return f"answer cites {listed} but only {n_sources} source(s) were given"
    return None
