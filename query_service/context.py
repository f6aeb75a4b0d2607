"""Context assembly: which retrieved chunks go into the prompt, in what form, within a budget.

    hits --merge overlapping neighbours--> candidates --priority--> fit whole chunks
         --first one that does not fit: compress to its most question-like sentences--> sources

priority = w_rel * relevance + w_rec * recency + w_auth * authority, each in [0, 1]:
  relevance  score / max score (all scores >= 0), else min-max normalised (logits)
  recency    0.5 ** (age / half_life) from ChunkRecord.doc_date; 0.5 when unknown
  authority  source_authority[chunk.source or document_id], else chunk.metadata["authority"],
             else 0.5

Sources are numbered 1.. in priority order and rendered as

    [n] Title — p. 3, Section > Sub (relevance 0.82)
    <text>

separated by blank lines. The rendered text's token count never exceeds the budget.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ragrpc.models import ScoredChunk
from ragrpc.tokens import TokenCounter

log = logging.getLogger(__name__)

Span = tuple[int, int]
SECONDS_PER_DAY = 86400.0
_SEPARATOR = "\n\n"
_STOPWORDS = frozenset(
    "a an and are as at be been but by can could did do does for from had has have how i if in "
    "into is it its me my no not of on or our so than that the their them then there these they "
    "this to was we were what when where which who whom why will with would you your about "
    "should may might must shall also any all some such only other more most very".split()
)
_ABBREVIATIONS = frozenset("e.g i.e etc vs dr mr mrs ms prof fig no p pp approx cf al st jr sr".split())
_SENTENCE_END = re.compile(r"[.!?]+[\"')\]]*(?:\s*\[\s*\d+(?:\s*[-,;]\s*\d+)*\s*\])*(?=\s|$)")
_HARD_BREAK = re.compile(r"\n\s*\n|\n(?=\s*(?:[-*•]|\d+[.)]|#{1,6})\s)")
_WORD = re.compile(r"\w+", re.UNICODE)


# --- text utilities (shared with the extractive generator and citation parsing) ---


def terms(text: str) -> list[str]:
    """Content words of a text: lower-cased, stopwords and 1-letter words dropped,
    a plural 's' stripped."""
    out = []
    for word in _WORD.findall(text.lower()):
        if len(word) < 2 or word in _STOPWORDS:
            continue
        if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        out.append(word)
    return out


def _is_abbreviation(text: str, dot: int) -> bool:
    start = dot
    while start > 0 and (text[start - 1].isalpha() or text[start - 1] == "."):
        start -= 1
    return text[start:dot].lower().rstrip(".") in _ABBREVIATIONS


def sentence_spans(text: str) -> list[Span]:
    """Character spans of the sentences of `text`, whitespace excluded. A sentence ends
    at . ! ? (plus closing quotes and citation markers like [2]) followed by whitespace,
    at a blank line, or before a list item / heading line."""
    cuts = {m.start() for m in _HARD_BREAK.finditer(text)}
    for m in _SENTENCE_END.finditer(text):
        if not _is_abbreviation(text, m.start()):
            cuts.add(m.end())
    spans: list[Span] = []
    start = 0
    for cut in sorted(cuts) + [len(text)]:
        piece = text[start:cut]
        stripped = piece.strip()
        if stripped:
            lead = len(piece) - len(piece.lstrip())
            spans.append((start + lead, start + lead + len(stripped)))
        start = cut
    return spans


def split_sentences(text: str) -> list[str]:
    return [text[a:b] for a, b in sentence_spans(text)]


# --- data ---


@dataclass(frozen=True)
class PriorityWeights:
    relevance: float = 0.6
    recency: float = 0.2
    authority: float = 0.2


@dataclass(frozen=True)
class ContextSource:
    """A numbered source given to the model. `hit` is the best-scored hit it came from;
    `chunk_ids` lists all chunks merged into it; `compressed` means sentences were left out."""

    number: int
    hit: ScoredChunk
    text: str
    title: str
    location: str
    relevance: float = 1.0
    priority: float = 0.0
    compressed: bool = False
    chunk_ids: tuple[str, ...] = ()


@dataclass
class AssembledContext:
    sources: list[ContextSource]
    text: str
    tokens: int
    dropped: int = 0  # candidates left out for lack of budget


@dataclass
class _Candidate:
    hit: ScoredChunk
    text: str
    page_start: int
    page_end: int
    chunk_ids: list[str] = field(default_factory=list)
    relevance: float = 0.0
    priority: float = 0.0


# --- overlap merging ---


def _overlap(left: str, right: str, min_chars: int) -> int | None:
    """Length of the longest suffix of `left` that is a prefix of `right` (>= min_chars),
    len(right) when `right` lies inside `left`, None when they do not overlap."""
    if right in left:
        return len(right)
    if len(right) < min_chars or len(left) < min_chars:
        return None
    probe = right[:min_chars]
    pos = left.find(probe)
    while pos != -1:
        if right.startswith(left[pos:]):
            return len(left) - pos
        pos = left.find(probe, pos + 1)
    return None


def _merge_pair(lower: _Candidate, upper: _Candidate, overlap: int) -> _Candidate:
    best = lower.hit if lower.hit.score >= upper.hit.score else upper.hit
    return _Candidate(
        hit=best,
        text=lower.text + upper.text[overlap:],
        page_start=min((p for p in (lower.page_start, upper.page_start) if p), default=0),
        page_end=max(lower.page_end, upper.page_end),
        chunk_ids=lower.chunk_ids + upper.chunk_ids,
    )


def merge_overlapping(hits: Sequence[ScoredChunk], min_overlap_chars: int = 12) -> list[_Candidate]:
    """One candidate per hit, except that hits of the same document with adjacent
    chunk_index whose texts overlap are merged (transitively), and exact duplicate
    texts are kept once. Order: by best score of the group."""
    by_doc: dict[str, list[_Candidate]] = {}
    for hit in hits:
        c = hit.chunk
        cand = _Candidate(hit, c.text, c.page_start, c.page_end or c.page_start, [c.chunk_id])
        by_doc.setdefault(c.document_id, []).append(cand)
    merged: list[_Candidate] = []
    for group in by_doc.values():
        group.sort(key=lambda cand: cand.hit.chunk.chunk_index)
        current, last_index = group[0], group[0].hit.chunk.chunk_index
        for nxt in group[1:]:
            index = nxt.hit.chunk.chunk_index
            overlap = _overlap(current.text, nxt.text, min_overlap_chars) if index == last_index + 1 else None
            if overlap is None:
                merged.append(current)
                current = nxt
            else:
                current = _merge_pair(current, nxt, overlap)
            last_index = index
        merged.append(current)
    seen: set[str] = set()
    unique = []
    for cand in sorted(merged, key=lambda cand: -cand.hit.score):
        key = " ".join(cand.text.split())
        if key not in seen:
            seen.add(key)
            unique.append(cand)
    return unique


# --- rendering ---


def format_location(page_start: int, page_end: int, section_path: Sequence[str]) -> str:
    parts = []
    if page_start and page_end and page_end != page_start:
        parts.append(f"pp. {page_start}–{page_end}")
    elif page_start:
        parts.append(f"p. {page_start}")
    if section_path:
        parts.append(" > ".join(section_path))
    return ", ".join(parts)


def render_source(number: int, title: str, location: str, relevance: float, text: str) -> str:
    where = f" — {location}" if location else ""
    return f"[{number}] {title}{where} (relevance {relevance:.2f})\n{text}"


def _title_of(hit: ScoredChunk) -> str:
    c = hit.chunk
    return c.title or c.source or c.document_id or "Untitled"


def _normalise_scores(scores: Sequence[float]) -> list[float]:
    if not scores:
        return []
    low, high = min(scores), max(scores)
    if low >= 0:
        return [s / high if high > 0 else 1.0 for s in scores]
    if high == low:
        return [1.0] * len(scores)
    return [(s - low) / (high - low) for s in scores]


def _clamp(value: float) -> float:
    return min(1.0, max(0.0, value))


class ContextAssembler:
    """Chooses, merges, compresses and numbers the chunks that go into the prompt."""

    def __init__(
        self,
        counter: TokenCounter,
        weights: PriorityWeights | None = None,
        source_authority: dict[str, float] | None = None,
        now: Callable[[], float] = time.time,
        recency_half_life_days: float = 365.0,
        min_overlap_chars: int = 12,
    ) -> None:
        self._counter = counter
        self._weights = weights or PriorityWeights()
        self._authority = dict(source_authority or {})
        self._now = now
        self._half_life_s = recency_half_life_days * SECONDS_PER_DAY
        self._min_overlap = min_overlap_chars

    # priority

    def recency(self, hit: ScoredChunk) -> float:
        doc_date = hit.chunk.doc_date
        if doc_date <= 0 or self._half_life_s <= 0:
            return 0.5
        age = max(0.0, self._now() - doc_date)
        return 0.5 ** (age / self._half_life_s)

    def authority(self, hit: ScoredChunk) -> float:
        c = hit.chunk
        for key in (c.source, c.document_id):
            if key and key in self._authority:
                return _clamp(float(self._authority[key]))
        raw = c.metadata.get("authority") if c.metadata else None
        try:
            return _clamp(float(raw)) if raw is not None else 0.5
        except (TypeError, ValueError):
            return 0.5

    def _prioritise(self, candidates: list[_Candidate]) -> list[_Candidate]:
        w = self._weights
        relevances = _normalise_scores([cand.hit.score for cand in candidates])
        for cand, rel in zip(candidates, relevances, strict=True):
            cand.relevance = rel
            cand.priority = (
                w.relevance * rel + w.recency * self.recency(cand.hit) + w.authority * self.authority(cand.hit)
            )
        return sorted(candidates, key=lambda cand: -cand.priority)

    # assembly

    def assemble(
        self, question: str, hits: Sequence[ScoredChunk], budget_tokens: int, reserved_tokens: int = 0
    ) -> AssembledContext:
        """Fits as much of `hits` as `budget_tokens - reserved_tokens` allows (see module doc)."""
        available = budget_tokens - reserved_tokens
        ordered = self._prioritise(merge_overlapping(hits, self._min_overlap))
        sources: list[ContextSource] = []
        blocks: list[str] = []
        for position, cand in enumerate(ordered):
            source = self._make_source(len(sources) + 1, cand, cand.text, compressed=False)
            if self._fits(blocks, self._block(source), available):
                sources.append(source)
                blocks.append(self._block(source))
                continue
            squeezed = self._compress(question, cand, len(sources) + 1, blocks, available)
            if squeezed is not None:
                sources.append(squeezed)
                blocks.append(self._block(squeezed))
            dropped = len(ordered) - position - (1 if squeezed is not None else 0)
            return self._result(sources, blocks, dropped)
        return self._result(sources, blocks, 0)

    def _result(self, sources: list[ContextSource], blocks: list[str], dropped: int) -> AssembledContext:
        text = _SEPARATOR.join(blocks)
        if dropped:
            log.debug("context budget: %s sources kept, %s dropped", len(sources), dropped)
        return AssembledContext(sources, text, self._counter.count(text), dropped)

    def _fits(self, blocks: list[str], block: str, available: int) -> bool:
        return self._counter.count(_SEPARATOR.join([*blocks, block])) <= available

    @staticmethod
    def _block(source: ContextSource) -> str:
        return render_source(source.number, source.title, source.location, source.relevance, source.text)

    @staticmethod
    def _make_source(number: int, cand: _Candidate, text: str, compressed: bool) -> ContextSource:
        return ContextSource(
            number=number,
            hit=cand.hit,
            text=text,
            title=_title_of(cand.hit),
            location=format_location(cand.page_start, cand.page_end, cand.hit.chunk.section_path),
            relevance=cand.relevance,
            priority=cand.priority,
            compressed=compressed,
            chunk_ids=tuple(cand.chunk_ids),
        )

    def _compress(
        self, question: str, cand: _Candidate, number: int, blocks: list[str], available: int
    ) -> ContextSource | None:
        """Keeps the sentences of `cand` most similar to the question (original order)
        that fit; None when not even one whole sentence fits."""
        spans = sentence_spans(cand.text)
        wanted = set(terms(question))
        ranked = sorted(
            range(len(spans)),
            key=lambda i: (-len(wanted & set(terms(cand.text[spans[i][0] : spans[i][1]]))), i),
        )
        kept: list[int] = []
        for index in ranked:
            trial = sorted([*kept, index])
            source = self._make_source(number, cand, _join_spans(cand.text, spans, trial), compressed=True)
            if self._fits(blocks, self._block(source), available):
                kept = trial
        if not kept:
            return None
        return self._make_source(number, cand, _join_spans(cand.text, spans, kept), compressed=True)


def _join_spans(text: str, spans: list[Span], indices: list[int]) -> str:
    """The chosen sentences in order; neighbours keep their original separator, gaps
    are marked with an ellipsis."""
    out: list[str] = []
    previous: int | None = None
    for index in indices:
        start, end = spans[index]
        if previous is None:
            out.append(text[start:end])
        elif index == previous + 1:
            out.append(text[spans[previous][1] : start] + text[start:end])
        else:
            out.append(" … " + text[start:end])
        previous = index
    return "".join(out)
