"""A real, small HTTP rerank server for tests (standard library only), serving both shapes:

    POST /v1/rerank  Cohere/Jina/vLLM: {model, query, documents, top_n} -> {results: [{index, relevance_score}]}
    POST /rerank     TEI:              {query, texts}                    -> [{index, score}]

Relevance is deterministic: the share of the query's words found in the document (lowercase `\\w+`
words), best first, ties by index. What each request gets is scripted with a Behaviour, the next
queued one (enqueue) else the default:

    Behaviour.ok()                    a correct answer
    Behaviour.error(500) / (400)      an HTTP error with a JSON body
    Behaviour.slow(delay_s)           a correct answer after delay_s (cut short when the server stops)
    Behaviour.malformed(kind)         not_json | no_results | bad_score
    Behaviour.wrong_indexes(kind)     out_of_range | duplicate | missing (one result fewer than asked)
    Behaviour.drop()                  closes the connection without answering

Every request is recorded (RequestRecord: path, headers, body, times from time.monotonic()).
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_WORD = re.compile(r"\w+")


def relevance(query: str, document: str) -> float:
    """Share of the query's distinct words that occur in the document (0 to 1)."""
    wanted = set(_WORD.findall(query.lower()))
    found = set(_WORD.findall(document.lower()))
    return len(wanted & found) / len(wanted) if wanted else 0.0


@dataclass(frozen=True)
class Behaviour:
    kind: str = "ok"  # ok | error | slow | malformed | wrong_indexes | drop
    status: int = 200
    delay_s: float = 0.0
    variant: str = ""

    @classmethod
    def ok(cls) -> Behaviour:
        return cls()

    @classmethod
    def error(cls, status: int) -> Behaviour:
        return cls("error", status=status)

    @classmethod
    def slow(cls, delay_s: float) -> Behaviour:
        return cls("slow", delay_s=delay_s)

    @classmethod
    def malformed(cls, variant: str) -> Behaviour:
        return cls("malformed", variant=variant)

    @classmethod
    def wrong_indexes(cls, variant: str) -> Behaviour:
        return cls("wrong_indexes", variant=variant)

    @classmethod
    def drop(cls) -> Behaviour:
        return cls("drop")


@dataclass
class RequestRecord:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    behaviour: Behaviour
    received_at: float
    finished_at: float | None = None


@dataclass
class _State:
    default: Behaviour
    queue: list[Behaviour] = field(default_factory=list)
    records: list[RequestRecord] = field(default_factory=list)


def ranked(query: str, documents: list[str]) -> list[tuple[int, float]]:
    """(index, relevance) of every document, best first, ties by index."""
    scored = [(i, relevance(query, d)) for i, d in enumerate(documents)]
    return sorted(scored, key=lambda pair: (-pair[1], pair[0]))


def _answer(path: str, body: dict[str, Any], behaviour: Behaviour) -> Any:
    """The JSON reply of a correct (or scripted wrong-index) answer in the route's shape."""
    if path == "/rerank":
        pairs = ranked(str(body["query"]), list(body["texts"]))
    else:
        pairs = ranked(str(body["query"]), list(body["documents"]))
        pairs = pairs[: int(body.get("top_n") or len(pairs))]
    if behaviour.kind == "wrong_indexes":
        if behaviour.variant == "out_of_range":
            pairs[0] = (len(pairs) + 5, pairs[0][1])
        elif behaviour.variant == "duplicate":
            pairs[-1] = (pairs[0][0], pairs[-1][1])
        else:
            pairs = pairs[:-1]
    if path == "/rerank":
        return [{"index": i, "score": s} for i, s in pairs]
    return {"id": "rerank-test", "results": [{"index": i, "relevance_score": s} for i, s in pairs]}


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        owner = self.server.owner
        behaviour = owner.next_behaviour()
        body = json.loads(raw or b"{}")
        record = RequestRecord(
            self.path, {k.lower(): v for k, v in self.headers.items()}, body, behaviour, time.monotonic()
        )
        owner.record(record)
        try:
            self._respond(record, behaviour)
        finally:
            record.finished_at = time.monotonic()

    def _respond(self, record: RequestRecord, behaviour: Behaviour) -> None:
        if behaviour.kind == "drop":
            self.close_connection = True
            return
        if record.path not in ("/rerank", "/v1/rerank"):
            self._send(404, {"error": f"no route POST {record.path}"})
        elif behaviour.kind == "error":
            self._send(behaviour.status, {"error": f"scripted HTTP {behaviour.status}"})
        elif behaviour.kind == "malformed" and behaviour.variant == "not_json":
            self._send_bytes(200, b"<html>upstream proxy error</html>", "text/html")
        elif behaviour.kind == "malformed" and behaviour.variant == "no_results":
            self._send(200, {"data": []})
        elif behaviour.kind == "malformed":  # bad_score
            self._send(
                200, [{"index": 0, "score": "high"}] if record.path == "/rerank" else {"results": [{"index": 0}]}
            )
        else:
            if behaviour.kind == "slow" and self.server.owner.stopping.wait(behaviour.delay_s):
                return
            self._send(200, _answer(record.path, record.body, behaviour))

    def _send(self, status: int, payload: Any) -> None:
        self._send_bytes(status, json.dumps(payload).encode(), "application/json")

    def _send_bytes(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: RerankServer


class RerankServer:
    """Start with `with RerankServer() as server:`; `server.url` is the base URL
    ("http://127.0.0.1:PORT"): the Cohere-shaped endpoint is url + "/v1/rerank", TEI's url + "/rerank"."""

    def __init__(self, default: Behaviour | None = None) -> None:
        self._state = _State(default or Behaviour.ok())
        self._lock = threading.Lock()
        self.stopping = threading.Event()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_default(self, behaviour: Behaviour) -> None:
        with self._lock:
            self._state.default = behaviour

    def enqueue(self, *behaviours: Behaviour) -> None:
        with self._lock:
            self._state.queue.extend(behaviours)

    def next_behaviour(self) -> Behaviour:
        with self._lock:
            return self._state.queue.pop(0) if self._state.queue else self._state.default

    def record(self, record: RequestRecord) -> None:
        with self._lock:
            self._state.records.append(record)

    @property
    def requests(self) -> list[RequestRecord]:
        with self._lock:
            return [replace(r) for r in self._state.records]

    def start(self) -> RerankServer:
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.02,), name="rerank-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None or self._thread is None:
            return
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)
        self._httpd = self._thread = None

    def __enter__(self) -> RerankServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
