"""Domain types of answer generation: requests, stream events and the Generator protocol.

A Generator streams one answer attempt:

    stream(request) -> TokenEvent, TokenEvent, ..., [UsageReport]

TokenEvents carry text to append to the answer, in order. The stream may end with one
UsageReport (finish reason and token counts as the backend reported them); a generator
that cannot count leaves the counts as None and the chain counts with tiktoken. A
failed attempt raises GenerationFailure, before or after some tokens went out.

The FallbackChain (chain.py) turns attempts of several generators into the events the
Ask stream needs: TokenEvent, RetractionEvent, and one GenerationDone last.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from ragrpc.tokens import TokenCounter

if TYPE_CHECKING:
    from query_service.context import ContextSource

FinishReason = Literal["stop", "length"]
Role = Literal["system", "user", "assistant"]
TOKENS_PER_MESSAGE = 4  # chat framing around each message's content
TOKENS_REPLY_PRIMING = 3  # framing that starts the assistant's reply


@dataclass(frozen=True)
class ChatMessage:
    """One message of a chat prompt (also used for conversation history turns)."""

    role: Role
    content: str


def count_prompt_tokens(messages: Sequence[ChatMessage], counter: TokenCounter) -> int:
    """Tokens a chat prompt costs: every message's content plus the chat framing."""
    return sum(counter.count(m.content) + TOKENS_PER_MESSAGE for m in messages) + TOKENS_REPLY_PRIMING


@dataclass
class GenerationRequest:
    """What a generator answers: the rendered prompt plus the numbered sources in it.

    `question` is the bare user question (the extractive generator scores sentences
    against it); when empty, generators that need it fall back to the last user message.
    """

    messages: Sequence[ChatMessage]
    max_tokens: int
    temperature: float | None = None
    sources: Sequence[ContextSource] = field(default_factory=list)
    question: str = ""


@dataclass(frozen=True)
class TokenEvent:
    """A piece of answer text to append."""

    text: str


@dataclass(frozen=True)
class UsageReport:
    """Last item of a generator stream (optional): why it stopped and what it used."""

    finish_reason: FinishReason = "stop"
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


@dataclass(frozen=True)
class RetractionEvent:
    """The answer streamed so far is void; another generator's tokens follow."""

    model: str
    reason: str


@dataclass(frozen=True)
class GenerationDone:
    """Last event of a chain run: who answered, why it ended, the answer and its usage."""

    model: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    answer: str


GeneratorEvent = TokenEvent | UsageReport
ChainEvent = TokenEvent | RetractionEvent | GenerationDone


class GenerationFailure(Exception):
    """A generator could not produce (or finish) its answer.

    retriable: the same backend may succeed later (connection error, 429, 5xx, timeout,
    malformed stream); False for errors that repeat (400, 401, 404 ...). The chain moves
    on to its next entry either way; `retriable` is reported and logged.
    """

    def __init__(self, reason: str, *, retriable: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retriable = retriable


class Generator(Protocol):
    """Streams an answer for a request (see the module docstring for the contract)."""

    @property
    def name(self) -> str:
        """Model name reported in retractions and the final event."""
        ...

    def stream(self, request: GenerationRequest) -> AsyncGenerator[GeneratorEvent, None]:
        """An async generator of TokenEvents, optionally ending with a UsageReport.
        Raises GenerationFailure; closing the iterator stops the generation upstream."""
        ...
