"""Prompt templates and the token-budgeted prompt builder.

Template files (`query_service/prompts/<name>.txt`) hold a system and a user part:

    # comment lines before the first section are ignored
    === system ===
    ...instructions...
    === user ===
    ...{context}...{history}...{question}...

Each of {context}, {question} and {history} must appear exactly once in the file; no other
{placeholder} is allowed. Values are substituted in one pass, so braces inside questions or
sources are left alone.

Budget (PromptBuilder): prompt_tokens(messages) + max_answer_tokens <= budget, where
prompt_tokens counts every message's content with tiktoken plus the chat framing overhead
(4 tokens per message, 3 to prime the reply). History is trimmed oldest-first; the
context gets what remains.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from query_service.context import AssembledContext, ContextAssembler
from query_service.generation.base import ChatMessage, GenerationRequest, count_prompt_tokens
from ragrpc.errors import InvalidInputError
from ragrpc.models import ScoredChunk
from ragrpc.tokens import TokenCounter

log = logging.getLogger(__name__)

DEFAULT_TEMPLATE_NAMES = ("default", "conversational", "analytical", "creative")
PLACEHOLDERS = ("context", "question", "history")
NO_HISTORY = "(none)"
NO_CONTEXT = "(no sources)"
_SECTION = re.compile(r"^===\s*(system|user)\s*===\s*$", re.MULTILINE | re.IGNORECASE)
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_DEFAULT_DIRECTORY = Path(__file__).parent / "prompts"


@dataclass(frozen=True)
class PromptTemplate:
    name: str
    system: str
    user: str


def _parse_template(name: str, raw: str) -> PromptTemplate:
    marks = list(_SECTION.finditer(raw))
    kinds = [m.group(1).lower() for m in marks]
    if kinds != ["system", "user"]:
        raise ValueError(f"prompt template {name!r}: needs '=== system ===' then '=== user ===' sections")
    system = raw[marks[0].end() : marks[1].start()].strip()
    user = raw[marks[1].end() :].strip()
    found = _PLACEHOLDER.findall(system + "\n" + user)
    unknown = sorted(set(found) - set(PLACEHOLDERS))
    if unknown:
        raise ValueError(f"prompt template {name!r}: unknown placeholders {unknown}")
    for placeholder in PLACEHOLDERS:
        if found.count(placeholder) != 1:
            raise ValueError(f"prompt template {name!r}: {{{placeholder}}} must appear exactly once")
    return PromptTemplate(name, system, user)


def _substitute(text: str, values: dict[str, str]) -> str:
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), text)


def format_history(history: Sequence[ChatMessage]) -> str:
    if not history:
        return NO_HISTORY
    return "\n".join(f"{turn.role.capitalize()}: {turn.content}" for turn in history)


class PromptTemplates:
    """The templates of a directory, loaded and validated once (ValueError when a file is
    malformed or a required template is missing)."""

    def __init__(self, directory: Path | str | None = None, required: Sequence[str] = DEFAULT_TEMPLATE_NAMES) -> None:
        folder = Path(directory) if directory is not None else _DEFAULT_DIRECTORY
        self._templates = {
            path.stem: _parse_template(path.stem, path.read_text(encoding="utf-8"))
            for path in sorted(folder.glob("*.txt"))
        }
        missing = [name for name in required if name not in self._templates]
        if missing:
            raise ValueError(f"prompt templates missing in {folder}: {', '.join(missing)}")

    @property
    def names(self) -> list[str]:
        return sorted(self._templates)

    def get(self, name: str) -> PromptTemplate:
        """The template `name` ("" means "default"); InvalidInputError listing the known names."""
        template = self._templates.get(name or "default")
        if template is None:
            raise InvalidInputError(
                f"unknown prompt template {name!r}; known templates: {', '.join(self.names)}",
                field="template",
                reason="UNKNOWN_TEMPLATE",
            )
        return template

    def render(self, name: str, question: str, context: str, history: Sequence[ChatMessage] = ()) -> list[ChatMessage]:
        template = self.get(name)
        values = {
            "context": context or NO_CONTEXT,
            "question": question,
            "history": format_history(history),
        }
        return [
            ChatMessage("system", _substitute(template.system, values)),
            ChatMessage("user", _substitute(template.user, values)),
        ]


@dataclass
class BuiltPrompt:
    messages: list[ChatMessage]
    context: AssembledContext
    prompt_tokens: int
    max_answer_tokens: int
    budget_tokens: int
    history_kept: int
    question: str

    def request(self, temperature: float | None = None) -> GenerationRequest:
        return GenerationRequest(
            messages=self.messages,
            max_tokens=self.max_answer_tokens,
            temperature=temperature,
            sources=self.context.sources,
            question=self.question,
        )


class PromptBuilder:
    """Builds the messages for a question so that prompt + answer reserve <= budget."""

    def __init__(
        self,
        templates: PromptTemplates,
        assembler: ContextAssembler,
        counter: TokenCounter,
        default_budget: int = 4000,
        default_max_answer_tokens: int = 512,
    ) -> None:
        self._templates = templates
        self._assembler = assembler
        self._counter = counter
        self._default_budget = default_budget
        self._default_answer = default_max_answer_tokens

    def build(
        self,
        question: str,
        hits: Sequence[ScoredChunk],
        template: str = "default",
        history: Sequence[ChatMessage] = (),
        budget_tokens: int | None = None,
        max_answer_tokens: int | None = None,
    ) -> BuiltPrompt:
        budget = budget_tokens or self._default_budget
        reserve = max_answer_tokens or self._default_answer
        self._templates.get(template)  # unknown name -> InvalidInputError
        base = self._cost(template, question, "", ()) + reserve
        if base > budget:
            raise InvalidInputError(
                f"the question, instructions and answer reserve need {base} tokens, more than the "
                f"token budget of {budget} tokens",
                field="token_budget",
                reason="TOKEN_BUDGET_TOO_SMALL",
                metadata={"budget_tokens": str(budget), "needed_tokens": str(base)},
            )
        kept = self._fit_history(template, question, list(history), budget - reserve)
        context = self._fit_context(template, question, kept, hits, budget - reserve)
        messages = self._templates.render(template, question, context.text, kept)
        return BuiltPrompt(
            messages=messages,
            context=context,
            prompt_tokens=count_prompt_tokens(messages, self._counter),
            max_answer_tokens=reserve,
            budget_tokens=budget,
            history_kept=len(kept),
            question=question,
        )

    def _cost(self, template: str, question: str, context: str, history: Sequence[ChatMessage]) -> int:
        messages = self._templates.render(template, question, context, history)
        return count_prompt_tokens(messages, self._counter)

    def _fit_history(self, template: str, question: str, history: list[ChatMessage], limit: int) -> list[ChatMessage]:
        """The newest turns whose prompt (without context) fits `limit`, oldest dropped first."""
        if not history:
            return []
        spare = limit - self._cost(template, question, "", ())
        start = len(history)
        for index in range(len(history) - 1, -1, -1):  # estimate from per-turn costs
            spare -= self._counter.count(format_history([history[index]])) + 1
            if spare < 0:
                break
            start = index
        while start < len(history) and self._cost(template, question, "", history[start:]) > limit:
            start += 1  # exact check; the estimate can be off by a token at the joins
        if start:
            log.debug("history trimmed: %s of %s turns dropped", start, len(history))
        return history[start:]

    def _fit_context(
        self,
        template: str,
        question: str,
        history: list[ChatMessage],
        hits: Sequence[ScoredChunk],
        limit: int,
    ) -> AssembledContext:
        """Assembles the context into what remains, shrinking until the whole prompt fits."""
        without = self._cost(template, question, "", history) - self._counter.count(NO_CONTEXT)
        reserved = without
        for _ in range(8):
            context = self._assembler.assemble(question, hits, limit, reserved)
            if not context.sources:
                break
            over = self._cost(template, question, context.text, history) - limit
            if over <= 0:
                return context
            reserved += over
        return AssembledContext([], "", 0, dropped=len(hits))
