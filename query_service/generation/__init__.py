"""Answer generation: LLM endpoints tried in order, then the local extractive generator.

Endpoints are configured by one string (e.g. the RAGRPC_LLM_ENDPOINTS variable), either
comma-separated entries of pipe-separated fields

    base_url|model[|api_key_env[|timeout_s]]

for example

    http://127.0.0.1:8080/v1|smollm2|OPENAI_API_KEY|30,https://api.openai.com/v1|gpt-4o-mini|OPENAI_API_KEY|30

or a JSON list of objects with the same keys (api_key_env and timeout_s optional):

    [{"base_url": "http://127.0.0.1:11434/v1", "model": "llama3.2", "timeout_s": 60}]

api_key_env names the environment variable holding the API key (default OPENAI_API_KEY;
when unset the key "not-needed" is sent, which local servers ignore). timeout_s (default
30) bounds every pause of the HTTP stream. An empty string means no endpoints: answers
come from the extractive generator only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from query_service.generation.base import (
    ChainEvent,
    ChatMessage,
    GenerationDone,
    GenerationFailure,
    GenerationRequest,
    Generator,
    RetractionEvent,
    TokenEvent,
    UsageReport,
)
from query_service.generation.chain import FallbackChain
from query_service.generation.citations import CitationSpan, parse_citations, validate
from query_service.generation.extractive import ExtractiveGenerator
from ragrpc.tokens import TokenCounter
from ragrpc.tracing import Tracer

__all__ = [
    "ChainEvent",
    "ChatMessage",
    "CitationSpan",
    "EndpointConfig",
    "ExtractiveGenerator",
    "FallbackChain",
    "GenerationDone",
    "GenerationFailure",
    "GenerationRequest",
    "Generator",
    "RetractionEvent",
    "TokenEvent",
    "UsageReport",
    "build_generator_chain",
    "parse_citations",
    "parse_endpoints",
    "validate",
]

DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"
DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class EndpointConfig:
    base_url: str
    model: str
    api_key_env: str = DEFAULT_API_KEY_ENV
    timeout_s: float = DEFAULT_TIMEOUT_S


def _endpoint(base_url: Any, model: Any, api_key_env: Any, timeout_s: Any, where: str) -> EndpointConfig:
    base_url, model = str(base_url or "").strip(), str(model or "").strip()
    if not base_url.startswith(("http://", "https://")):
        raise ValueError(f"LLM endpoint {where}: base_url must start with http(s)://, got {base_url!r}")
    if not model:
        raise ValueError(f"LLM endpoint {where}: model is missing")
    try:
        timeout = float(timeout_s) if str(timeout_s).strip() else DEFAULT_TIMEOUT_S
    except ValueError:
        raise ValueError(f"LLM endpoint {where}: timeout_s must be a number, got {timeout_s!r}") from None
    if timeout <= 0:
        raise ValueError(f"LLM endpoint {where}: timeout_s must be positive")
    return EndpointConfig(base_url, model, str(api_key_env or "").strip() or DEFAULT_API_KEY_ENV, timeout)


def _parse_json(text: str) -> list[EndpointConfig]:
    try:
        items = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"LLM endpoints: invalid JSON: {err}") from None
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise ValueError("LLM endpoints: JSON must be a list of objects")
    return [
        _endpoint(
            item.get("base_url"),
            item.get("model"),
            item.get("api_key_env"),
            item.get("timeout_s", DEFAULT_TIMEOUT_S),
            f"#{number}",
        )
        for number, item in enumerate(items, 1)
    ]


def parse_endpoints(text: str) -> list[EndpointConfig]:
    """Parses the endpoint list (format in the module docstring); ValueError when malformed."""
    text = (text or "").strip()
    if not text:
        return []
    if text.startswith("["):
        return _parse_json(text)
    out = []
    for number, entry in enumerate((e.strip() for e in text.split(",")), 1):
        if not entry:
            continue
        fields = [f.strip() for f in entry.split("|")]
        if len(fields) < 2 or len(fields) > 4:
            raise ValueError(
                f"LLM endpoint #{number}: expected base_url|model[|api_key_env[|timeout_s]], got {entry!r}"
            )
        fields += [""] * (4 - len(fields))
        out.append(_endpoint(fields[0], fields[1], fields[2], fields[3], f"#{number}"))
    return out


def build_generator_chain(
    endpoints: Sequence[EndpointConfig],
    *,
    first_token_timeout_s: float = 10.0,
    counter: TokenCounter | None = None,
    client_factory: Any = None,
    extractive: ExtractiveGenerator | None = None,
    tracer: Tracer | None = None,
) -> FallbackChain:
    """One OpenAiChatGenerator per endpoint, in order, then the extractive generator.
    The first-token timeout is capped by each endpoint's timeout_s."""
    from query_service.generation.openai_chat import OpenAiChatGenerator

    generators: list[Generator] = [
        OpenAiChatGenerator(
            base_url=e.base_url,
            model=e.model,
            api_key_env=e.api_key_env,
            timeout_s=e.timeout_s,
            first_token_timeout_s=min(first_token_timeout_s, e.timeout_s),
            client_factory=client_factory,
        )
        for e in endpoints
    ]
    generators.append(extractive or ExtractiveGenerator())
    return FallbackChain(generators, counter=counter, tracer=tracer)
