"""OpenAiEmbedder: embeddings from any OpenAI-compatible `/v1/embeddings` endpoint (OpenAI, Azure
OpenAI's v1 API, vLLM, Ollama, TEI, LM Studio) through the `openai` package's synchronous client
(RAGRPC_EMBEDDING_PROVIDER=openai). Like every Embedder it is called from executor threads; the
client is shared by them.

- Texts go out `request_size` per request, in order; vectors come back as L2-normalised float32,
  normalised here too (servers need not: TEI with normalize=false, some vLLM pooling settings).
- Vectors are asked for as base64 (`encoding_format`), and the answer's JSON is read here, straight
  into one float32 matrix: the openai package's own parsing builds a Python object per component,
  which cost an ingest service more CPU than everything else it does for a chunk beside a fast
  endpoint (docs/benchmarks.md, ingest_ceiling). An endpoint that answers floats anyway is read as
  well; one that refuses base64 at warm-up (HTTP 400 or 422) is asked for floats from then on.
- `dimensions` > 0 is sent with every request (Matryoshka models such as text-embedding-3-*);
  0 sends none and takes the model's own dimension.
- warm_up() sends one request: it learns the dimension (or checks the requested one) and fails at
  start, naming the endpoint, when the endpoint cannot be reached or refuses.
- Retries are the openai client's (`max_retries`): connection errors, timeouts, HTTP 408, 409, 429
  and 5xx, after exponential backoff (0.5 s doubling up to 8 s, jittered) or after the server's
  Retry-After / retry-after-ms. What still fails becomes a ragrpc error, so nothing is stored:

      connection error, timeout, 408/409/429/5xx   UnavailableError   UNAVAILABLE (RetryInfo from Retry-After)
      any other HTTP error (key, model, dimensions) PreconditionError  FAILED_PRECONDITION  EMBEDDING_REQUEST_REFUSED
      vectors of another dimension than expected   PreconditionError  FAILED_PRECONDITION  EMBEDDING_DIMENSION_MISMATCH
      a malformed answer (count, shape, non-finite) InternalError     INTERNAL             EMBEDDING_BAD_RESPONSE

- Chunk sizes are counted with tiktoken (cl100k_base: OpenAI's embedding models; o200k_base) or with
  the served model's own tokenizer.json, against `max_tokens` (8191 for OpenAI's models).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ragrpc import deadlines, errors
from ragrpc.config import BUNDLED_MODEL, Settings
from ragrpc.tokens import SUPPORTED_ENCODINGS, HfTokenCounter, TiktokenCounter, TokenCounter

logger = logging.getLogger(__name__)

PROVIDER = "openai"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
_RETRIABLE_STATUS = frozenset({408, 409, 429})
_DETAIL_CHARS = 300
_BASE64_REFUSED = frozenset({400, 422})  # what a server that knows no `encoding_format: base64` answers


def remote_token_counter(tokenizer: str) -> TokenCounter:
    """A tiktoken encoding by name, or a Hugging Face tokenizer.json by path."""
    if tokenizer in SUPPORTED_ENCODINGS:
        return TiktokenCounter(tokenizer)
    path = Path(tokenizer)
    if not path.is_file():
        raise ValueError(
            f"RAGRPC_EMBEDDING_TOKENIZER={tokenizer!r}: no such file; use cl100k_base, o200k_base "
            "or the path of the served model's tokenizer.json"
        )
    from tokenizers import Tokenizer

    return HfTokenCounter(Tokenizer.from_file(str(path)))


class OpenAiEmbedder:
    """One model of one OpenAI-compatible endpoint (the model name is the collection's model_id)."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str = DEFAULT_BASE_URL,
        api_key_env: str = "OPENAI_API_KEY",
        dimensions: int = 0,
        request_size: int = 32,
        timeout_s: float = 30.0,
        max_retries: int = 3,
        max_tokens: int = 8191,
        tokenizer: str = "cl100k_base",
        query_instruction: str = "",
        streams: int = 1,
    ) -> None:
        _validate(model, base_url, dimensions, request_size, timeout_s, max_retries, max_tokens, tokenizer, streams)
        self._model = model
        self._base_url = base_url
        self._api_key_env = api_key_env
        self._requested_dimensions = dimensions
        self._dimension: int | None = dimensions or None
        self._request_size = request_size
        self._timeout_s = timeout_s
        self._max_retries = max_retries
        self._max_tokens = max_tokens
        self._tokenizer = tokenizer
        self._query_instruction = query_instruction
        self._streams = streams
        self._encoding = "base64"  # "float" once the endpoint refused base64 at warm-up
        self._client: Any = None
        self._counter: TokenCounter | None = None
        self._warm = False
        self._warm_lock = threading.Lock()
        self._client_lock = threading.Lock()

    @property
    def provider(self) -> str:
        return PROVIDER

    @property
    def model_id(self) -> str:
        return self._model

    @property
    def dimension(self) -> int:
        if self._dimension is None:
            self.warm_up()
        assert self._dimension is not None
        return self._dimension

    @property
    def max_tokens(self) -> int:
        return self._max_tokens

    @property
    def streams(self) -> int:
        return self._streams

    def token_counter(self) -> TokenCounter:
        with self._warm_lock:
            if self._counter is None:
                self._counter = remote_token_counter(self._tokenizer)
            return self._counter

    def warm_up(self) -> None:
        """One request: learns (or checks) the dimension; fails here when the endpoint is unusable."""
        self.token_counter()
        with self._warm_lock:
            if self._warm:
                return
            try:
                probe = self._request(["warm up"])
            except errors.PreconditionError as exc:
                if exc.metadata.get("http_status") not in {str(s) for s in _BASE64_REFUSED}:
                    raise
                logger.info("%s refused base64 embeddings (%s); asking for floats", self._where, exc.message)
                self._encoding = "float"
                probe = self._request(["warm up"])
            self._dimension = int(probe.shape[1])
            self._warm = True

    def close(self) -> None:
        """Closes the HTTP client (its connection pool)."""
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        parts = [
            self._request(texts[start : start + self._request_size])
            for start in range(0, len(texts), self._request_size)
        ]
        return np.vstack(parts)

    def embed_query(self, text: str) -> np.ndarray:
        """One request, bounded by the current call's deadline (ragrpc.deadlines) when there is one:
        its HTTP timeout is the time left, and it is not retried past it."""
        left = deadlines.time_left_s()
        if left is None:
            return self.embed_documents([self._query_instruction + text])[0]
        if left <= 0:
            raise errors.DeadlineError("no time was left to embed the query", reason="QUERY_EMBEDDING_TIMEOUT")
        timeout = min(self._timeout_s, left)
        retries = self._max_retries if left > 2 * self._timeout_s else 0
        return self._request([self._query_instruction + text], timeout_s=timeout, max_retries=retries)[0]

    def _get_client(self) -> Any:
        with self._client_lock:
            if self._client is None:
                import openai

                self._client = openai.OpenAI(
                    base_url=self._base_url,
                    api_key=os.environ.get(self._api_key_env) or "not-needed",
                    timeout=self._timeout_s,
                    max_retries=self._max_retries,
                )
            return self._client

    def _request(
        self, texts: list[str], *, timeout_s: float | None = None, max_retries: int | None = None
    ) -> np.ndarray:
        import openai

        # The API refuses an empty string as input; a space embeds the same nothing.
        body: dict[str, Any] = {
            "model": self._model,
            "input": [t or " " for t in texts],
            "encoding_format": self._encoding,
        }
        if self._requested_dimensions:
            body["dimensions"] = self._requested_dimensions
        client = self._get_client()
        if timeout_s is not None or max_retries is not None:
            client = client.with_options(
                timeout=self._timeout_s if timeout_s is None else timeout_s,
                max_retries=self._max_retries if max_retries is None else max_retries,
            )
        try:
            # The client's generic POST (its retries, auth and errors) with the answer as text: the
            # embeddings resource would also walk every input text through its request transform.
            content = client.post("/embeddings", body=body, cast_to=str)
        except openai.APIError as err:
            raise self._failure(err) from err
        return self._vectors(content, len(texts))

    @property
    def _where(self) -> str:
        return f"embedding endpoint {self._base_url} (model {self._model!r})"

    def _failure(self, err: Any) -> errors.RagrpcError:
        import openai

        retried = f"retried up to {self._max_retries} times (RAGRPC_EMBEDDING_MAX_RETRIES)"
        if isinstance(err, openai.APITimeoutError):
            return errors.UnavailableError(
                f"{self._where} did not answer within {self._timeout_s:g}s (RAGRPC_EMBEDDING_TIMEOUT_S); {retried}",
                reason="EMBEDDING_TIMEOUT",
            )
        if isinstance(err, openai.APIConnectionError):
            cause = f" ({err.__cause__})" if err.__cause__ else ""
            return errors.UnavailableError(
                f"{self._where} is unreachable{cause}; check RAGRPC_EMBEDDING_BASE_URL; {retried}",
                reason="EMBEDDING_UNAVAILABLE",
            )
        if not isinstance(err, openai.APIStatusError):
            return errors.UnavailableError(f"{self._where} failed: {err.message}", reason="EMBEDDING_UNAVAILABLE")
        status = err.status_code
        detail = _detail(err)
        metadata = {"http_status": str(status), "base_url": self._base_url, "model": self._model}
        if status in _RETRIABLE_STATUS or status >= 500:
            return errors.UnavailableError(
                f"{self._where} answered HTTP {status}: {detail}; {retried}",
                retry_after_s=_retry_after_s(err.response.headers),
                reason="EMBEDDING_UNAVAILABLE",
                metadata=metadata,
            )
        return errors.PreconditionError(
            f"{self._where} refused the request with HTTP {status}: {detail}{self._refusal_hint(status)}",
            reason="EMBEDDING_REQUEST_REFUSED",
            metadata=metadata,
        )

    def _refusal_hint(self, status: int) -> str:
        if status in (401, 403):
            state = "set" if os.environ.get(self._api_key_env) else "unset"
            return f"; check the API key in ${self._api_key_env} ({state}; RAGRPC_EMBEDDING_API_KEY_ENV)"
        if status == 404:
            return "; check RAGRPC_EMBEDDING_MODEL and RAGRPC_EMBEDDING_BASE_URL"
        if self._requested_dimensions:
            return (
                f"; RAGRPC_EMBEDDING_DIMENSIONS={self._requested_dimensions} is sent as `dimensions`, which "
                "models without Matryoshka training (and some servers) refuse"
            )
        return ""

    def _vectors(self, content: str | bytes, expected: int) -> np.ndarray:
        """The answer's vectors in `index` order, L2-normalised, as one float32 matrix (each item's
        `embedding` base64 of little-endian float32, or a list of numbers)."""
        try:
            data = sorted(json.loads(content)["data"], key=lambda item: item["index"])
            rows = [_embedding_array(item["embedding"]) for item in data]
            indexes = [item["index"] for item in data]
        except (ValueError, TypeError, KeyError, binascii.Error) as exc:
            raise self._bad_response(f"unreadable embeddings ({type(exc).__name__}: {exc})") from exc
        if indexes != list(range(expected)) or len({len(row) for row in rows}) != 1:
            raise self._bad_response(f"{len(data)} embeddings for {expected} texts (indexes {indexes[:8]})")
        matrix = np.stack(rows)
        self._check_dimension(int(matrix.shape[1]))
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        if not np.all(np.isfinite(norms)) or not np.all(norms > 0):
            raise self._bad_response("a zero or non-finite vector")
        return matrix / norms

    def _bad_response(self, what: str) -> errors.InternalError:
        return errors.InternalError(
            f"{self._where} answered with {what}, not one finite vector per text",
            reason="EMBEDDING_BAD_RESPONSE",
        )

    def _check_dimension(self, got: int) -> None:
        expected = self._dimension
        if expected is None:
            self._dimension = got  # the first answer, when it came before warm_up()
            return
        if got == expected:
            return
        if self._requested_dimensions:
            why = f"RAGRPC_EMBEDDING_DIMENSIONS={expected}, sent as `dimensions`: does the server ignore it?"
        else:
            why = "as at start-up: was the model behind the endpoint changed?"
        raise errors.PreconditionError(
            f"{self._where} returned {got}-dimensional vectors, expected {expected} ({why})",
            reason="EMBEDDING_DIMENSION_MISMATCH",
            metadata={"expected_dimension": str(expected), "returned_dimension": str(got)},
        )


def _embedding_array(value: Any) -> np.ndarray:
    """One answer item's `embedding`: base64 of little-endian float32, or a list of numbers."""
    if isinstance(value, str):
        raw = base64.b64decode(value, validate=True)
        if len(raw) % 4:
            raise ValueError(f"{len(raw)} bytes of base64 are not float32 components")
        return np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if not isinstance(value, list) or not value:
        raise ValueError(f"an embedding must be base64 or a list of numbers, got {type(value).__name__}")
    return np.asarray(value, dtype=np.float32)


def _detail(err: Any) -> str:
    body = err.body
    message = body.get("message") if isinstance(body, dict) else None
    text = str(message or err.message)
    return text if len(text) <= _DETAIL_CHARS else text[:_DETAIL_CHARS] + "…"


def _retry_after_s(headers: Any, default: float = 1.0) -> float:
    """The server's Retry-After (retry-after-ms, or retry-after in seconds), else `default`."""
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        try:
            value = float(headers.get(name, ""))
        except ValueError:
            continue
        if np.isfinite(value) and value >= 0:
            return value / divisor
    return default


def _validate(
    model: str,
    base_url: str,
    dimensions: int,
    request_size: int,
    timeout_s: float,
    max_retries: int,
    max_tokens: int,
    tokenizer: str,
    streams: int,
) -> None:
    checks = [
        (
            bool(model.strip()) and model != BUNDLED_MODEL,
            "RAGRPC_EMBEDDING_MODEL must name the endpoint's model (e.g. text-embedding-3-small) "
            f"with RAGRPC_EMBEDDING_PROVIDER={PROVIDER}, got {model!r}",
        ),
        (
            base_url.startswith(("http://", "https://")),
            f"RAGRPC_EMBEDDING_BASE_URL must start with http:// or https://, got {base_url!r}",
        ),
        (dimensions >= 0, f"RAGRPC_EMBEDDING_DIMENSIONS must be >= 0 (0: the model's own), got {dimensions}"),
        (request_size >= 1, f"RAGRPC_EMBEDDING_REQUEST_SIZE must be at least 1, got {request_size}"),
        (timeout_s > 0, f"RAGRPC_EMBEDDING_TIMEOUT_S must be positive, got {timeout_s}"),
        (max_retries >= 0, f"RAGRPC_EMBEDDING_MAX_RETRIES must be >= 0, got {max_retries}"),
        (max_tokens >= 1, f"RAGRPC_EMBEDDING_MAX_TOKENS must be at least 1, got {max_tokens}"),
        (
            tokenizer in SUPPORTED_ENCODINGS or tokenizer.endswith(".json"),
            f"RAGRPC_EMBEDDING_TOKENIZER must be cl100k_base, o200k_base or a tokenizer.json path, got {tokenizer!r}",
        ),
        (streams >= 1, f"embedding streams must be at least 1, got {streams}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


def openai_embedder_from_settings(settings: Settings, *, streams: int = 1) -> OpenAiEmbedder:
    return OpenAiEmbedder(
        settings.embedding_model,
        base_url=settings.embedding_base_url,
        api_key_env=settings.embedding_api_key_env,
        dimensions=settings.embedding_dimensions,
        request_size=settings.embedding_request_size,
        timeout_s=settings.embedding_timeout_s,
        max_retries=settings.embedding_max_retries,
        max_tokens=settings.embedding_max_tokens,
        tokenizer=settings.embedding_tokenizer,
        query_instruction=settings.query_instruction,
        streams=streams,
    )
