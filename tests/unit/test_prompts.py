from __future__ import annotations

from pathlib import Path

import pytest

from query_service.context import ContextAssembler
from query_service.generation.base import ChatMessage, count_prompt_tokens
from query_service.prompt_templates import DEFAULT_TEMPLATE_NAMES, PromptBuilder, PromptTemplates
from ragrpc.errors import InvalidInputError
from ragrpc.models import ChunkRecord, ScoredChunk
from ragrpc.tokens import TiktokenCounter

GOOD = "=== system ===\nAnswer from sources only.\n=== user ===\n{context}\n{history}\n{question}\n"


@pytest.fixture(scope="module")
def counter() -> TiktokenCounter:
    return TiktokenCounter()


@pytest.fixture(scope="module")
def templates() -> PromptTemplates:
    return PromptTemplates()


@pytest.fixture()
def builder(templates, counter) -> PromptBuilder:
    return PromptBuilder(templates, ContextAssembler(counter), counter)


def hit(i: int, text: str) -> ScoredChunk:
    chunk = ChunkRecord(
        chunk_id=f"c{i}",
        document_id=f"d{i}",
        tenant="t",
        collection="c",
        generation="g",
        text=text,
        vector=[],
        chunk_index=0,
        chunker="test",
        title=f"Doc {i}",
        page_start=i,
        page_end=i,
    )
    return ScoredChunk(chunk, 1.0 - i / 100)


def test_the_four_templates_load(templates):
    assert templates.names == sorted(DEFAULT_TEMPLATE_NAMES)


@pytest.mark.parametrize("name", DEFAULT_TEMPLATE_NAMES)
def test_each_template_grounds_cites_and_admits_ignorance(templates, name):
    messages = templates.render(name, "Q?", "[1] Doc\ntext", [])
    assert [m.role for m in messages] == ["system", "user"]
    text = "\n".join(m.content for m in messages).lower()
    assert "only" in text and "numbered sources" in text
    assert "[n]" in text and "cite" in text
    assert "do not contain" in text or "can't find" in text


def test_unknown_template_lists_the_known_names(templates):
    with pytest.raises(InvalidInputError) as err:
        templates.render("poetic", "Q?", "", [])
    for name in DEFAULT_TEMPLATE_NAMES:
        assert name in err.value.message
    assert err.value.field_violations[0][0] == "template"


def test_empty_name_means_default(templates):
    assert templates.render("", "Q?", "ctx", []) == templates.render("default", "Q?", "ctx", [])


def test_render_substitutes_once_and_leaves_braces_alone(templates):
    history = [ChatMessage("user", "earlier {question}"), ChatMessage("assistant", "reply")]
    messages = templates.render("default", "What is {context}?", "source says {history}", history)
    user = messages[1].content
    assert "What is {context}?" in user
    assert "source says {history}" in user
    assert "User: earlier {question}\nAssistant: reply" in user


def test_empty_history_and_context_render_placeholders_text(templates):
    user = templates.render("default", "Q?", "", [])[1].content
    assert "(none)" in user and "(no sources)" in user


@pytest.mark.parametrize(
    "content, problem",
    [
        ("=== user ===\n{context}{history}{question}", "sections"),
        ("=== system ===\nx\n=== user ===\n{context}{history}{question}{extra}", "unknown placeholders"),
        ("=== system ===\nx\n=== user ===\n{context}{question}", "{history}"),
        ("=== system ===\n{question}\n=== user ===\n{context}{history}{question}", "{question}"),
    ],
)
def test_malformed_templates_are_rejected_at_load(tmp_path: Path, content, problem):
    (tmp_path / "default.txt").write_text(content)
    with pytest.raises(ValueError, match="default") as err:
        PromptTemplates(tmp_path, required=("default",))
    assert problem in str(err.value)


def test_missing_required_template_is_rejected(tmp_path: Path):
    (tmp_path / "default.txt").write_text(GOOD)
    with pytest.raises(ValueError, match="creative"):
        PromptTemplates(tmp_path)
    assert PromptTemplates(tmp_path, required=("default",)).names == ["default"]


def test_history_is_trimmed_oldest_first(builder, counter):
    history = [ChatMessage("user" if i % 2 == 0 else "assistant", f"turn {i} " + "blah " * 60) for i in range(40)]
    built = builder.build("What now?", [], history=history, budget_tokens=1500, max_answer_tokens=200)
    assert 0 < built.history_kept < 40
    user = built.messages[1].content
    assert f"turn {39} " in user and "turn 0 " not in user
    kept_from = 40 - built.history_kept
    assert f"turn {kept_from} " in user and f"turn {kept_from - 1} " not in user
    assert count_prompt_tokens(built.messages, counter) + 200 <= 1500


def test_context_gets_what_remains(builder, counter):
    hits = [hit(i, " ".join(f"Fact {i}.{j} is short." for j in range(40))) for i in range(1, 30)]
    built = builder.build("Which fact?", hits, budget_tokens=3000, max_answer_tokens=300)
    assert built.prompt_tokens == count_prompt_tokens(built.messages, counter)
    assert 3000 - 40 <= built.prompt_tokens + 300 <= 3000
    assert [s.number for s in built.context.sources] == list(range(1, len(built.context.sources) + 1))
    request = built.request(temperature=0.2)
    assert request.sources == built.context.sources and request.max_tokens == 300
    assert request.question == "Which fact?" and request.temperature == 0.2


def test_defaults_are_4000_tokens_and_512_for_the_answer(builder):
    built = builder.build("Q?", [hit(1, "Short.")])
    assert built.budget_tokens == 4000 and built.max_answer_tokens == 512


def test_a_question_that_cannot_fit_names_the_budget(builder):
    with pytest.raises(InvalidInputError) as err:
        builder.build("why " * 600, [hit(1, "x.")], budget_tokens=500, max_answer_tokens=100)
    assert "500" in err.value.message and err.value.metadata["budget_tokens"] == "500"


def test_unknown_template_fails_before_any_work(builder):
    with pytest.raises(InvalidInputError, match="known templates"):
        builder.build("Q?", [], template="nope")
