"""Reranking by a remote HTTP rerank API, in one of two request shapes (RAGRPC_RERANKER_API):

    cohere  POST {model, query, documents: [text], top_n, return_documents: false}
            -> {results: [{index, relevance_score}, ...]}       Cohere, Jina, vLLM (/v1/rerank)
    tei     POST {query, texts: [text], truncate: true}
            -> [{index, score}, ...]                            text-embeddings-inference (/rerank)

One call per request, with a total time limit: RAGRPC_RERANKER_TIMEOUT_S, or less when the RPC's
deadline (`time_left`, from `ragrpc.deadlines`) comes sooner, less a reserve kept for the stages
after rerank (see `_budget`). The API key is sent as a Bearer token.

Every failure raises `RerankUnavailableError` with a cause (connection, timeout, deadline,
http_status, malformed, bad_indexes) after a warning is logged and `on_failure(cause)` is called
(the composition root counts it in ragrpc_rerank_failures_total); the pipeline then keeps the
fused order and says why in the summary. A response is accepted only when it scores exactly the
documents asked for (top_n of them, cohere; all of them, tei), each index once: a partial answer
is a failure, never a silently shorter list.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from query_service.rerank import RerankUnavailableError, with_rerank_score
from ragrpc.config import Settings
from ragrpc.models import ScoredChunk

logger = logging.getLogger(__name__)

APIS = ("cohere", "tei")
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
_READ_SIZE = 64 * 1024


@dataclass(frozen=True)
class RemoteRerankConfig:
    url: str
    api: str = "cohere"
    model: str = ""
    timeout_s: float = 5.0
    api_key: str = field(default="", repr=False)

    @classmethod
    def from_settings(cls, settings: Settings, env: Mapping[str, str] | None = None) -> RemoteRerankConfig:
        """Validated settings (ValueError naming the variable); the key is read from `env` (os.environ)."""
        source = os.environ if env is None else env
        url = settings.reranker_url.strip()
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"RAGRPC_RERANKER_URL must be an http(s):// URL of the rerank endpoint, got {url!r}")
        api = settings.reranker_api.strip().lower()
        if api not in APIS:
            raise ValueError(f"RAGRPC_RERANKER_API must be one of {', '.join(APIS)}, got {settings.reranker_api!r}")
        if not math.isfinite(settings.reranker_timeout_s) or settings.reranker_timeout_s <= 0:
            raise ValueError(f"RAGRPC_RERANKER_TIMEOUT_S must be positive, got {settings.reranker_timeout_s}")
        key_env = settings.reranker_api_key_env.strip()
        api_key = source.get(key_env, "") if key_env else ""
        if key_env and not api_key:
            raise ValueError(f"RAGRPC_RERANKER_API_KEY_ENV names {key_env}, which is not set (or empty)")
        return cls(url, api, settings.reranker_model.strip(), settings.reranker_timeout_s, api_key)


class RemoteReranker:
    """A `Reranker` calling a rerank endpoint; safe to call from several threads at once."""

    def __init__(
        self,
        config: RemoteRerankConfig,
        *,
        time_left: Callable[[], float | None] = lambda: None,
        on_failure: Callable[[str], None] | None = None,
        deadline_reserve_s: float = 0.1,
    ) -> None:
        self.config = config
        self._time_left = time_left
        self._on_failure = on_failure
        self._reserve_s = deadline_reserve_s
        self._transport = _JsonPost(config.url, config.api_key)

    def rerank(self, query: str, hits: Sequence[ScoredChunk], top_n: int) -> list[ScoredChunk]:
        if top_n <= 0 or not hits:
            return []
        top_n = min(top_n, len(hits))
        try:
            scores = self._scores(query, [hit.chunk.text for hit in hits], top_n)
        except RerankUnavailableError as exc:
            logger.warning(
                "remote reranker %s failed (%s): %s; keeping the fused order", self.config.url, exc.cause, exc.detail
            )
            if self._on_failure is not None:
                self._on_failure(exc.cause)
            raise
        order = sorted(scores, key=lambda pair: (-pair[1], hits[pair[0]].chunk.chunk_id))
        return [with_rerank_score(hits[index], score) for index, score in order[:top_n]]

    def _budget(self) -> tuple[float, str]:
        """Seconds the call may take, and the cause to report when it takes longer: the configured
        timeout, or the time left before the RPC's deadline less a reserve (the larger of
        deadline_reserve_s and a tenth of that time) for the stages after rerank."""
        left = self._time_left()
        usable = None if left is None else left - max(self._reserve_s, 0.1 * left)
        if usable is None or usable >= self.config.timeout_s:
            return self.config.timeout_s, "timeout"
        if usable <= 0:
            raise RerankUnavailableError("deadline", f"{max(left or 0.0, 0.0):.3f}s left before the request's deadline")
        return usable, "deadline"

    def _scores(self, query: str, texts: list[str], top_n: int) -> list[tuple[int, float]]:
        budget_s, late_cause = self._budget()
        try:
            status, data = self._transport.post(_request_body(self.config, query, texts, top_n), budget_s)
        except TimeoutError:
            limit = "the request's deadline" if late_cause == "deadline" else "RAGRPC_RERANKER_TIMEOUT_S"
            raise RerankUnavailableError(late_cause, f"no answer within {budget_s:.2f}s ({limit})") from None
        except (OSError, http.client.HTTPException) as exc:
            raise RerankUnavailableError("connection", f"{type(exc).__name__}: {exc}") from None
        if status != 200:
            raise RerankUnavailableError("http_status", f"HTTP {status}: {_snippet(data)}")
        try:
            payload = json.loads(data)
        except ValueError:
            raise RerankUnavailableError("malformed", f"response is not JSON: {_snippet(data)}") from None
        expected = top_n if self.config.api == "cohere" else len(texts)
        return _checked(_pairs(self.config.api, payload), len(texts), expected)


def _request_body(config: RemoteRerankConfig, query: str, texts: list[str], top_n: int) -> dict[str, Any]:
    if config.api == "tei":
        return {"query": query, "texts": texts, "truncate": True}
    body: dict[str, Any] = {"query": query, "documents": texts, "top_n": top_n, "return_documents": False}
    if config.model:
        body["model"] = config.model
    return body


def _pairs(api: str, payload: Any) -> list[tuple[int, float]]:
    """(index, score) of every result in the response; RerankUnavailableError when malformed."""
    if api == "tei":
        results, score_key, where = payload, "score", "response"
    else:
        results = payload.get("results") if isinstance(payload, dict) else None
        score_key, where = "relevance_score", "results"
    if not isinstance(results, list):
        raise RerankUnavailableError("malformed", f"{where} is not a list of results")
    pairs = []
    for n, item in enumerate(results):
        index = item.get("index") if isinstance(item, dict) else None
        score = item.get(score_key) if isinstance(item, dict) else None
        if not isinstance(index, int) or isinstance(index, bool):
            raise RerankUnavailableError("malformed", f"{where}[{n}] has no integer index")
        if not isinstance(score, int | float) or isinstance(score, bool) or not math.isfinite(score):
            raise RerankUnavailableError("malformed", f"{where}[{n}] has no finite {score_key}")
        pairs.append((index, float(score)))
    return pairs


def _checked(pairs: list[tuple[int, float]], documents: int, expected: int) -> list[tuple[int, float]]:
    seen: set[int] = set()
    for index, _ in pairs:
        if not 0 <= index < documents:
            raise RerankUnavailableError("bad_indexes", f"index {index} for {documents} documents")
        if index in seen:
            raise RerankUnavailableError("bad_indexes", f"index {index} appears twice")
        seen.add(index)
    if len(pairs) != expected:
        raise RerankUnavailableError("bad_indexes", f"{len(pairs)} results where {expected} were asked for")
    return pairs


def _snippet(data: bytes, limit: int = 200) -> str:
    text = " ".join(data.decode("utf-8", "replace").split())
    return text[:limit] + ("..." if len(text) > limit else "") if text else "(empty body)"


class _JsonPost:
    """POSTs JSON with one limit on the whole exchange (connect, send, every read), on a fresh
    connection each call (http.client: no dependency; no connection is shared between threads)."""

    def __init__(self, url: str, api_key: str) -> None:
        parts = urlsplit(url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": "ragrpc"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"

    def post(self, body: dict[str, Any], timeout_s: float) -> tuple[int, bytes]:
        """(status, body); TimeoutError past timeout_s, OSError / HTTPException when the exchange fails."""
        deadline = time.monotonic() + timeout_s

        def left() -> float:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            return remaining

        kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        connection = kind(self._host, self._port, timeout=left())
        response: http.client.HTTPResponse | None = None
        try:
            connection.connect()
            sock = connection.sock  # kept: the response reads through it after the connection lets it go
            sock.settimeout(left())
            connection.request("POST", self._target, body=json.dumps(body).encode(), headers=self._headers)
            sock.settimeout(left())
            response = connection.getresponse()
            data = bytearray()
            while True:
                sock.settimeout(left())
                piece = response.read1(_READ_SIZE)
                if not piece:
                    return response.status, bytes(data)
                data += piece
                if len(data) > MAX_RESPONSE_BYTES:
                    raise RerankUnavailableError("malformed", f"response larger than {MAX_RESPONSE_BYTES} bytes")
        finally:
            if response is not None:
                response.close()
            connection.close()
