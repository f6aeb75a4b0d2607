from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from query_service.context import (
    ContextAssembler,
    PriorityWeights,
    format_location,
    merge_overlapping,
    render_source,
    sentence_spans,
    split_sentences,
)
from query_service.generation.base import ChatMessage, count_prompt_tokens
from query_service.prompt_templates import DEFAULT_TEMPLATE_NAMES, PromptBuilder, PromptTemplates
from ragrpc.errors import InvalidInputError
from ragrpc.models import ChunkRecord, ScoredChunk
from ragrpc.tokens import TiktokenCounter

NOW = 1_700_000_000.0
DAY = 86400


@pytest.fixture(scope="module")
def counter() -> TiktokenCounter:
    return TiktokenCounter()


@pytest.fixture(scope="module")
def templates() -> PromptTemplates:
    return PromptTemplates()


def hit(
    chunk_id: str,
    text: str,
    score: float,
    *,
    doc: str = "",
    index: int = 0,
    doc_date: int = 0,
    source: str = "",
    metadata: dict | None = None,
    title: str = "",
    pages: tuple[int, int] = (0, 0),
    section: tuple[str, ...] = (),
) -> ScoredChunk:
    chunk = ChunkRecord(
        chunk_id=chunk_id,
        document_id=doc or f"doc-{chunk_id}",
        tenant="t",
        collection="c",
        generation="g",
        text=text,
        vector=[],
        chunk_index=index,
        chunker="test",
        source=source,
        title=title or f"Title {chunk_id}",
        doc_date=doc_date,
        metadata=metadata or {},
        page_start=pages[0],
        page_end=pages[1],
        section_path=section,
    )
    return ScoredChunk(chunk, score)


def assembler(counter, **kw) -> ContextAssembler:
    return ContextAssembler(counter, now=lambda: NOW, **kw)


# --- priority and weights ---


def test_relevance_orders_by_default(counter):
    hits = [hit("low", "Low.", 0.2), hit("high", "High.", 0.9), hit("mid", "Mid.", 0.5)]
    ctx = assembler(counter).assemble("q", hits, 1000)
    assert [s.hit.chunk.chunk_id for s in ctx.sources] == ["high", "mid", "low"]
    assert [s.number for s in ctx.sources] == [1, 2, 3]
    assert ctx.sources[0].relevance == 1.0 and ctx.sources[2].relevance == pytest.approx(0.2 / 0.9)


def test_recency_weight_can_put_a_newer_document_first(counter):
    old = hit("old", "Old.", 0.9, doc_date=int(NOW - 10 * 365 * DAY))
    new = hit("new", "New.", 0.6, doc_date=int(NOW - DAY))
    default = assembler(counter).assemble("q", [old, new], 1000)
    assert [s.hit.chunk.chunk_id for s in default.sources] == ["old", "new"]
    recent_first = assembler(counter, weights=PriorityWeights(0.3, 0.7, 0.0)).assemble("q", [old, new], 1000)
    assert [s.hit.chunk.chunk_id for s in recent_first.sources] == ["new", "old"]


def test_recency_decays_with_half_life_and_is_neutral_when_unknown(counter):
    a = assembler(counter, recency_half_life_days=30)
    assert a.recency(hit("x", "x", 1, doc_date=int(NOW))) == pytest.approx(1.0)
    assert a.recency(hit("x", "x", 1, doc_date=int(NOW - 30 * DAY))) == pytest.approx(0.5)
    assert a.recency(hit("x", "x", 1, doc_date=int(NOW - 60 * DAY))) == pytest.approx(0.25)
    assert a.recency(hit("x", "x", 1)) == 0.5


def test_authority_from_config_then_metadata_then_default(counter):
    a = assembler(counter, source_authority={"handbook.pdf": 0.9})
    assert a.authority(hit("x", "x", 1, source="handbook.pdf", metadata={"authority": 0.1})) == 0.9
    assert a.authority(hit("x", "x", 1, metadata={"authority": "0.3"})) == 0.3
    assert a.authority(hit("x", "x", 1, metadata={"authority": "high"})) == 0.5
    assert a.authority(hit("x", "x", 1)) == 0.5


def test_authority_weight_can_reorder(counter):
    blog = hit("blog", "Blog.", 0.8, source="blog")
    spec = hit("spec", "Spec.", 0.7, source="spec")
    weights = PriorityWeights(relevance=0.2, recency=0.0, authority=0.8)
    ctx = assembler(counter, weights=weights, source_authority={"spec": 1.0, "blog": 0.1}).assemble(
        "q", [blog, spec], 1000
    )
    assert [s.hit.chunk.chunk_id for s in ctx.sources] == ["spec", "blog"]


def test_negative_scores_are_min_max_normalised(counter):
    ctx = assembler(counter).assemble("q", [hit("a", "A.", -3.0), hit("b", "B.", 5.0), hit("c", "C.", 1.0)], 1000)
    assert [round(s.relevance, 2) for s in ctx.sources] == [1.0, 0.5, 0.0]


# --- rendering ---


def test_source_header_format(counter):
    h = hit("a", "Body text.", 0.82, title="Handbook", pages=(3, 3), section=("Section", "Sub"))
    ctx = assembler(counter).assemble("q", [h, hit("b", "Other.", 1.0)], 1000)
    assert "[2] Handbook — p. 3, Section > Sub (relevance 0.82)\nBody text." in ctx.text
    assert ctx.tokens == counter.count(ctx.text)
    assert render_source(1, "T", "", 0.5, "x") == "[1] T (relevance 0.50)\nx"
    assert format_location(3, 5, ()) == "pp. 3–5"


# --- fitting and compression ---


def test_whole_chunks_fit_in_priority_order_and_the_first_misfit_is_compressed(counter):
    first = hit("first", "Alpha is the first letter. " * 5, 0.9)
    second_text = (
        "This sentence is about weather. The refund policy allows returns within thirty days. "
        "Bananas are yellow. Refunds are paid to the original card. Trains are often late."
    )
    second = hit("second", second_text, 0.8)
    third = hit("third", "Small.", 0.1)
    a = assembler(counter)
    whole_first = counter.count(a.assemble("q", [first], 10_000).text)
    budget = whole_first + 40
    ctx = a.assemble("How do refunds work?", [first, second, third], budget)
    assert ctx.tokens <= budget
    assert [s.hit.chunk.chunk_id for s in ctx.sources] == ["first", "second"]
    squeezed = ctx.sources[1]
    assert squeezed.compressed and "refund" in squeezed.text.lower()
    original = split_sentences(second_text)
    kept = [s for s in split_sentences(squeezed.text.replace(" … ", " "))]
    assert kept and all(s in original for s in kept)  # whole sentences only
    assert [original.index(s) for s in kept] == sorted(original.index(s) for s in kept)
    assert ctx.dropped == 1


def test_nothing_fits_gives_an_empty_context(counter):
    ctx = assembler(counter).assemble("q", [hit("a", "Some text here.", 1.0)], 5)
    assert ctx.sources == [] and ctx.text == "" and ctx.tokens == 0 and ctx.dropped == 1


def test_a_sentence_longer_than_the_budget_is_never_cut(counter):
    long_sentence = "word " * 300 + "end."
    ctx = assembler(counter).assemble("word", [hit("a", long_sentence, 1.0)], 100)
    assert ctx.sources == []


# --- overlap merging ---


def test_adjacent_overlapping_chunks_of_a_document_are_merged(counter):
    a = hit("a", "One two three. Four five six. Seven eight nine.", 0.9, doc="d", index=3, pages=(1, 1))
    b = hit("b", "Four five six. Seven eight nine. Ten eleven twelve.", 0.5, doc="d", index=4, pages=(2, 2))
    ctx = assembler(counter).assemble("q", [b, a], 1000)
    assert len(ctx.sources) == 1
    merged = ctx.sources[0]
    assert merged.text == "One two three. Four five six. Seven eight nine. Ten eleven twelve."
    assert merged.chunk_ids == ("a", "b") and merged.hit.chunk.chunk_id == "a"
    assert merged.location == "pp. 1–2"
    assert ctx.text.count("Seven eight nine") == 1


def test_chains_of_overlaps_merge_transitively_and_contained_chunks_vanish():
    hits = [
        hit("a", "aaaa bbbb cccc dddd eeee ffff", 0.5, doc="d", index=0),
        hit("b", "dddd eeee ffff gggg hhhh iiii", 0.5, doc="d", index=1),
        hit("c", "gggg hhhh iiii", 0.5, doc="d", index=2),
    ]
    (merged,) = merge_overlapping(hits)
    assert merged.text == "aaaa bbbb cccc dddd eeee ffff gggg hhhh iiii"
    assert merged.chunk_ids == ["a", "b", "c"]


def test_no_merge_without_overlap_across_gaps_or_across_documents():
    text_a, text_b = "Shared start of text. More words here.", "More words here. And the rest."
    cases = [
        [hit("a", text_a, 1, doc="d", index=0), hit("b", "Completely different.", 1, doc="d", index=1)],
        [hit("a", text_a, 1, doc="d", index=0), hit("b", text_b, 1, doc="d", index=2)],
        [hit("a", text_a, 1, doc="d", index=0), hit("b", text_b, 1, doc="e", index=1)],
    ]
    for hits in cases:
        assert len(merge_overlapping(hits)) == 2


def test_exact_duplicates_are_kept_once():
    hits = [hit("a", "Same text.", 0.9, doc="d1"), hit("b", "Same  text.", 0.5, doc="d2")]
    assert [c.hit.chunk.chunk_id for c in merge_overlapping(hits)] == ["a"]


def test_sentence_spans_handle_abbreviations_decimals_and_lists():
    text = "Dr. Smith paid 3.5 euros, e.g. for tea. Then left!\n- item one\n- item two"
    assert split_sentences(text) == [
        "Dr. Smith paid 3.5 euros, e.g. for tea.",
        "Then left!",
        "- item one",
        "- item two",
    ]
    assert all(text[a:b] == text[a:b].strip() for a, b in sentence_spans(text))


# --- the budget is never exceeded ---

WORDS = st.sampled_from(
    "the refund policy allows returns within days warranty covers parts émigré 東京 🙂 {context} "
    "naïve x123 data-driven Straße API v2.1 — … 42".split()
)
SENTENCE = st.lists(WORDS, min_size=1, max_size=40).map(lambda ws: " ".join(ws) + ".")
CHUNK_TEXT = st.lists(SENTENCE, min_size=1, max_size=12).map(" ".join)


@st.composite
def chunk_mix(draw) -> list[ScoredChunk]:
    n = draw(st.integers(0, 12))
    hits = []
    for i in range(n):
        text = draw(CHUNK_TEXT)
        if i and draw(st.booleans()):  # sometimes an overlapping neighbour of the previous chunk
            prev = hits[-1].chunk
            text = prev.text[len(prev.text) // 2 :] + " " + text
            hits.append(hit(f"c{i}", text, draw(st.floats(-5, 5)), doc=prev.document_id, index=prev.chunk_index + 1))
            continue
        hits.append(
            hit(
                f"c{i}",
                text,
                draw(st.floats(-5, 5)),
                doc=f"d{draw(st.integers(0, 3))}",
                index=draw(st.integers(0, 50)),
                doc_date=draw(st.integers(0, int(NOW))),
                metadata={"authority": draw(st.floats(0, 1))},
                pages=(draw(st.integers(0, 9)),) * 2,
                section=tuple(draw(st.lists(WORDS, max_size=3))),
            )
        )
    return hits


HISTORY = st.lists(st.builds(ChatMessage, st.sampled_from(["user", "assistant"]), CHUNK_TEXT), max_size=30)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    template=st.sampled_from(DEFAULT_TEMPLATE_NAMES),
    history=HISTORY,
    hits=chunk_mix(),
    question=st.one_of(SENTENCE, CHUNK_TEXT),
    budget=st.integers(200, 5000),
    reserve=st.integers(1, 1200),
)
def test_prompt_plus_answer_reserve_never_exceeds_the_budget(
    counter, templates, template, history, hits, question, budget, reserve
):
    builder = PromptBuilder(templates, ContextAssembler(counter, now=lambda: NOW), counter)
    try:
        built = builder.build(question, hits, template, history, budget, reserve)
    except InvalidInputError as err:
        bare = count_prompt_tokens(templates.render(template, question, "", []), counter)
        assert bare + reserve > budget and str(budget) in err.message
        return
    total = count_prompt_tokens(built.messages, counter)
    assert total == built.prompt_tokens and total + reserve <= budget
    assert counter.count("".join(m.content for m in built.messages)) + reserve <= budget
    assert [s.number for s in built.context.sources] == list(range(1, len(built.context.sources) + 1))
    kept = history[len(history) - built.history_kept :] if built.history_kept else []
    assert built.messages == templates.render(template, question, built.context.text, kept)
