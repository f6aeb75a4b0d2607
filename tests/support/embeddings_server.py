"""A real, small OpenAI-compatible embeddings server for tests (standard library and numpy only).

It listens on 127.0.0.1 (port chosen by the OS), one thread per connection, and answers
`POST /v1/embeddings` as the OpenAI API does: `{"object": "list", "data": [{"object": "embedding",
"index": i, "embedding": [...]}], "model": ..., "usage": {...}}`, as JSON floats or base64
(`encoding_format`).

Vectors are deterministic hashed bags of words (texts that share words are similar, so retrieval
works) of `dimension` components and deliberately NOT unit length (as a server with normalisation
off answers). A request's `dimensions` keeps that prefix of the vector, as a Matryoshka model does
(more than `dimension` is HTTP 400, as OpenAI answers); a model outside `models` (when given) is 404.

What each request gets is scripted with a Behaviour: the next queued one (enqueue), else the default
(set_default):

    Behaviour.ok()                          vectors
    Behaviour.ok(dimension=N)               N components whatever was asked (a wrong dimension)
    Behaviour.ok(reverse=True)              the data items in reverse order (their index fields right)
    Behaviour.error(status, retry_after)    an HTTP error with an OpenAI-style JSON body (and Retry-After)
    Behaviour.slow(delay_s)                 vectors after a delay (a client timeout fires first)

Every request is recorded (RequestRecord): its body, Authorization header, arrival time
(time.monotonic()) and the status answered.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

_WORDS = re.compile(r"\w+", re.UNICODE)
SCALE = 3.0  # raw vectors are this many times a unit vector's length, or more


def hashed_vector(text: str, dimension: int) -> np.ndarray:
    """The server's raw (unnormalised) vector of `text`: signed word counts hashed into `dimension` slots,
    plus a small component shared by every text in slot 0 (so no prefix of a vector is zero)."""
    vector = np.zeros(dimension, dtype=np.float32)
    vector[0] = 0.25
    for word in _WORDS.findall(text.lower()):
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        vector[int.from_bytes(digest[:4], "little") % dimension] += 1.0 if digest[4] & 1 else -1.0
    return vector * SCALE


@dataclass(frozen=True)
class Behaviour:
    kind: str = "ok"  # ok | error | slow
    status: int = 200
    retry_after: str | None = None
    delay_s: float = 0.0
    dimension: int | None = None  # answer this many components whatever was asked
    reverse: bool = False

    @classmethod
    def ok(cls, *, dimension: int | None = None, reverse: bool = False) -> Behaviour:
        return cls("ok", dimension=dimension, reverse=reverse)

    @classmethod
    def error(cls, status: int, retry_after: str | None = None) -> Behaviour:
        return cls("error", status=status, retry_after=retry_after)

    @classmethod
    def slow(cls, delay_s: float) -> Behaviour:
        return cls("slow", delay_s=delay_s)


@dataclass
class RequestRecord:
    path: str
    body: dict[str, Any]
    authorization: str
    received_at: float
    behaviour: Behaviour
    status: int = 0

    @property
    def inputs(self) -> list[str]:
        value = self.body.get("input", [])
        return [value] if isinstance(value, str) else list(value)


@dataclass
class _State:
    default: Behaviour
    queue: list[Behaviour] = field(default_factory=list)
    records: list[RequestRecord] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the openai client expects
    server: _Server

    def do_POST(self) -> None:  # noqa: N802 - the http.server naming
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            self.server.owner.handle(self, raw)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up (its timeout)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        return

    def send_json(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    owner: EmbeddingsServer


def _error_body(status: int, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error" if status < 500 else "server_error"}}


class EmbeddingsServer:
    """Start with `with EmbeddingsServer() as server:` (or start()/stop()); `server.url` is the base
    URL to give an OpenAI client ("http://127.0.0.1:PORT/v1")."""

    def __init__(
        self, dimension: int = 64, default: Behaviour | None = None, models: tuple[str, ...] | None = None
    ) -> None:
        self.dimension = dimension
        self.models = models
        self.refused_word: str | None = None  # a request with a text holding it is answered HTTP 400
        self.refused_encodings: frozenset[str] = frozenset()  # encoding_format values answered HTTP 400
        self.floats_only = False  # answers JSON floats whatever encoding_format asks (as some servers do)
        self._state = _State(default or Behaviour.ok())
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def enqueue(self, *behaviours: Behaviour) -> None:
        with self._lock:
            self._state.queue.extend(behaviours)

    def set_default(self, behaviour: Behaviour) -> None:
        with self._lock:
            self._state.default = behaviour

    @property
    def requests(self) -> list[RequestRecord]:
        with self._lock:
            return [replace(r) for r in self._state.records]

    def clear(self) -> None:
        with self._lock:
            self._state.records.clear()

    def _pick(self) -> Behaviour:
        with self._lock:
            return self._state.queue.pop(0) if self._state.queue else self._state.default

    def handle(self, handler: _Handler, raw: bytes) -> None:
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            body = {}
        behaviour = self._pick()
        record = RequestRecord(
            handler.path, body, handler.headers.get("Authorization", ""), time.monotonic(), behaviour
        )
        with self._lock:
            self._state.records.append(record)
        status, payload, headers = self._answer(handler.path, body, behaviour)
        record.status = status
        handler.send_json(status, payload, headers)

    def _answer(self, path: str, body: dict[str, Any], b: Behaviour) -> tuple[int, dict[str, Any], dict[str, str]]:
        if path != "/v1/embeddings":
            return 404, _error_body(404, f"no route {path}"), {}
        if b.kind == "error":
            headers = {"Retry-After": b.retry_after} if b.retry_after is not None else {}
            return b.status, _error_body(b.status, f"scripted HTTP {b.status}"), headers
        if b.kind == "slow" and self._stopping.wait(b.delay_s):
            return 503, _error_body(503, "server stopping"), {}
        model = str(body.get("model", ""))
        if self.models is not None and model not in self.models:
            return 404, _error_body(404, f"The model `{model}` does not exist"), {}
        wanted = body.get("dimensions") or self.dimension
        if not isinstance(wanted, int) or not 0 < wanted <= self.dimension:
            return 400, _error_body(400, f"dimensions must be between 1 and {self.dimension}, got {wanted}"), {}
        if body.get("encoding_format", "float") in self.refused_encodings:
            return 400, _error_body(400, f"encoding_format {body.get('encoding_format')!r} is not supported"), {}
        texts = body.get("input", [])
        texts = [texts] if isinstance(texts, str) else list(texts)
        if self.refused_word is not None and any(self.refused_word in t for t in texts):
            return 400, _error_body(400, "one of the inputs was refused by the content filter"), {}
        size = b.dimension or wanted
        shape = {**body, "encoding_format": "float"} if self.floats_only else body
        items = [self._item(i, hashed_vector(t, max(size, self.dimension))[:size], shape) for i, t in enumerate(texts)]
        if b.reverse:
            items.reverse()
        usage = sum(len(_WORDS.findall(t)) for t in texts)
        payload = {
            "object": "list",
            "data": items,
            "model": model,
            "usage": {"prompt_tokens": usage, "total_tokens": usage},
        }
        return 200, payload, {}

    @staticmethod
    def _item(index: int, vector: np.ndarray, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("encoding_format") == "base64":
            embedding: Any = base64.b64encode(vector.astype("<f4").tobytes()).decode()
        else:
            embedding = [float(x) for x in vector]
        return {"object": "embedding", "index": index, "embedding": embedding}

    def start(self) -> EmbeddingsServer:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="embeddings-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(10)
        self._server = self._thread = None

    def __enter__(self) -> EmbeddingsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
