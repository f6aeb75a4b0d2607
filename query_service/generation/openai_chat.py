"""Generator for any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, Ollama,
llama.cpp server, LM Studio, ...), streamed.

Failures become GenerationFailure: retriable for connection errors, timeouts, HTTP 408 /
409 / 429 / 5xx and malformed or truncated streams; not retriable for other HTTP 4xx.
`first_token_timeout_s` bounds the wait from sending the request to the first answer text;
after that the client's read timeout (`timeout_s`) bounds every pause of the stream.
Closing the iterator (cancellation, aclose) closes the upstream HTTP response, which makes
the server stop generating.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from query_service.generation.base import (
    FinishReason,
    GenerationFailure,
    GenerationRequest,
    GeneratorEvent,
    TokenEvent,
    UsageReport,
)

log = logging.getLogger(__name__)

ClientFactory = Callable[..., Any]
_RETRIABLE_STATUS = frozenset({408, 409, 425, 429})


def _default_client_factory(**kwargs: Any) -> Any:
    import openai

    return openai.AsyncOpenAI(**kwargs)


def to_failure(err: BaseException, first_token_timeout_s: float) -> GenerationFailure:
    """Maps an exception of the openai client (or of the stream) to a GenerationFailure."""
    import openai

    if isinstance(err, GenerationFailure):
        return err
    if isinstance(err, asyncio.TimeoutError):
        return GenerationFailure(f"no answer text within {first_token_timeout_s:g}s", retriable=True)
    if isinstance(err, openai.APITimeoutError):
        return GenerationFailure("request timed out", retriable=True)
    if isinstance(err, openai.APIConnectionError):
        cause = f": {err.__cause__}" if err.__cause__ else ""
        return GenerationFailure(f"connection error{cause}", retriable=True)
    if isinstance(err, openai.APIStatusError):
        status = err.status_code
        retriable = status in _RETRIABLE_STATUS or status >= 500
        body = err.body.get("message") if isinstance(err.body, dict) else None
        return GenerationFailure(f"HTTP {status}: {body or err.message}", retriable=retriable)
    if isinstance(err, openai.APIError):
        return GenerationFailure(f"upstream error: {err.message}", retriable=True)
    if isinstance(err, (ValueError, TypeError, AttributeError)):
        return GenerationFailure(f"malformed stream: {err}", retriable=True)
    return GenerationFailure(f"unexpected error: {type(err).__name__}: {err}", retriable=False)


def _parse_chunk(chunk: Any) -> tuple[str, str | None, Any]:
    """(text, finish_reason, usage) of one streamed chunk; ValueError when malformed."""
    try:
        usage = getattr(chunk, "usage", None)
        choices = getattr(chunk, "choices", None) or []
        if not choices:
            return "", None, usage
        choice = choices[0]
        delta = getattr(choice, "delta", None)
        text = getattr(delta, "content", None) or ""
        if not isinstance(text, str):
            raise ValueError(f"delta content is {type(text).__name__}, not text")
        return text, getattr(choice, "finish_reason", None), usage
    except (TypeError, AttributeError, KeyError, IndexError) as err:
        raise ValueError(f"unexpected chunk shape: {err}") from err


class OpenAiChatGenerator:
    """Streams chat completions from one endpoint; `name` is the model name."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 30.0,
        first_token_timeout_s: float = 10.0,
        client_factory: ClientFactory | None = None,
    ) -> None:
        self.name = model
        self.base_url = base_url
        self._model = model
        self._api_key_env = api_key_env
        self._timeout_s = timeout_s
        self._first_token_timeout_s = first_token_timeout_s
        self._factory = client_factory or _default_client_factory
        self._client: Any = None
        self._stream_options_ok = True

    def _get_client(self) -> Any:
        if self._client is None:
            self._client = self._factory(
                base_url=self.base_url,
                api_key=os.environ.get(self._api_key_env, "not-needed"),
                max_retries=0,
                timeout=self._timeout_s,
            )
        return self._client

    async def aclose(self) -> None:
        """Closes the HTTP client (its connection pool)."""
        client, self._client = self._client, None
        if client is not None and hasattr(client, "close"):
            await client.close()

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[GeneratorEvent, None]:
        client = self._get_client()  # outside the deadline: the first one imports openai
        deadline = asyncio.get_running_loop().time() + self._first_token_timeout_s
        try:
            upstream = await self._open(client, request, deadline)
        except Exception as err:  # CancelledError is not an Exception: it propagates
            raise to_failure(err, self._first_token_timeout_s) from err
        try:
            async for event in self._events(upstream, deadline):
                yield event
        except Exception as err:
            raise to_failure(err, self._first_token_timeout_s) from err
        finally:
            await upstream.close()  # stops the generation upstream when we leave early

    def _arguments(self, request: GenerationRequest, with_usage: bool) -> dict[str, Any]:
        args: dict[str, Any] = {
            "model": self._model,
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
            "stream": True,
        }
        if request.max_tokens > 0:
            args["max_tokens"] = request.max_tokens
        if request.temperature is not None:
            args["temperature"] = request.temperature
        if with_usage:
            args["stream_options"] = {"include_usage": True}
        return args

    async def _open(self, client: Any, request: GenerationRequest, deadline: float) -> Any:
        """Sends the request (asking for usage in the stream when the server accepts it)."""
        import openai

        create = client.chat.completions.create
        remaining = deadline - asyncio.get_running_loop().time()
        if not self._stream_options_ok:
            return await asyncio.wait_for(create(**self._arguments(request, False)), remaining)
        try:
            return await asyncio.wait_for(create(**self._arguments(request, True)), remaining)
        except (openai.BadRequestError, openai.UnprocessableEntityError) as err:
            log.info("%s rejected the request with stream_options (%s); retrying without", self.name, err)
        remaining = deadline - asyncio.get_running_loop().time()
        upstream = await asyncio.wait_for(create(**self._arguments(request, False)), remaining)
        self._stream_options_ok = False
        return upstream

    async def _next_chunk(self, upstream: Any, deadline: float | None) -> Any:
        if deadline is None:
            return await upstream.__anext__()
        remaining = deadline - asyncio.get_running_loop().time()
        return await asyncio.wait_for(upstream.__anext__(), max(remaining, 0.0))

    async def _events(self, upstream: Any, deadline: float) -> AsyncIterator[GeneratorEvent]:
        finish: str | None = None
        usage: Any = None
        first_deadline: float | None = deadline
        while True:
            try:
                chunk = await self._next_chunk(upstream, first_deadline)
            except StopAsyncIteration:
                break
            text, chunk_finish, chunk_usage = _parse_chunk(chunk)
            finish = chunk_finish or finish
            usage = chunk_usage or usage
            if text:
                first_deadline = None
                yield TokenEvent(text)
        if finish is None:
            raise GenerationFailure("stream ended before the answer was finished", retriable=True)
        reason: FinishReason = "length" if finish == "length" else "stop"
        yield UsageReport(
            finish_reason=reason,
            prompt_tokens=getattr(usage, "prompt_tokens", None),
            completion_tokens=getattr(usage, "completion_tokens", None),
        )
