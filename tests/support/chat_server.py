"""A real, small OpenAI-compatible chat-completions server for tests (no dependencies).

It listens on 127.0.0.1 (port chosen by the OS) in a background thread with its own event
loop and answers `POST /v1/chat/completions` with `stream: true` as the OpenAI API does:
HTTP/1.1 chunked `text/event-stream`, `data: {chunk json}\\n\\n` ... `data: [DONE]\\n\\n`.

What each request gets is scripted with a Behaviour, chosen by the request's `model`
(set_behaviour), else the next queued one (enqueue), else the default:

    Behaviour.stream(text, delay_s)   tokens (words) with a delay between them
    Behaviour.error(500) / (429)      an HTTP error with an OpenAI-style JSON body
    Behaviour.hang()                  accepts the request and never answers
    Behaviour.malformed(after)        `after` good tokens, then a chunk of invalid JSON
    Behaviour.die(after)              `after` good tokens, then the connection is dropped

Every request is recorded (RequestRecord, times from time.monotonic()): when it arrived,
when the first token and the end were sent, and when the client disconnected before the
end, so tests can check that a cancelled caller closed the upstream request.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

_WORDS = re.compile(r"\s*\S+")


@dataclass(frozen=True)
class Behaviour:
    kind: str = "stream"  # stream | error | hang | malformed | die
    text: str = "The answer is in the first source [1]."
    delay_s: float = 0.02
    status: int = 500
    after_tokens: int = 0
    reject_stream_options: bool = False  # 400 when the request has stream_options
    finish_reason: str = "stop"

    @classmethod
    def stream(
        cls, text: str = "The answer is in the first source [1].", delay_s: float = 0.02, **kw: Any
    ) -> Behaviour:
        return cls("stream", text, delay_s, **kw)

    @classmethod
    def error(cls, status: int) -> Behaviour:
        return cls("error", status=status)

    @classmethod
    def hang(cls) -> Behaviour:
        return cls("hang")

    @classmethod
    def malformed(cls, after_tokens: int = 2, delay_s: float = 0.02) -> Behaviour:
        return cls("malformed", delay_s=delay_s, after_tokens=after_tokens)

    @classmethod
    def die(cls, after_tokens: int = 3, delay_s: float = 0.02) -> Behaviour:
        return cls("die", delay_s=delay_s, after_tokens=after_tokens)


@dataclass
class RequestRecord:
    model: str
    body: dict[str, Any]
    behaviour: Behaviour
    received_at: float
    status: int = 200
    tokens_sent: int = 0
    first_token_at: float | None = None
    finished_at: float | None = None  # the server sent its last byte
    disconnected_at: float | None = None  # the client closed before the server finished


@dataclass
class _State:
    default: Behaviour
    by_model: dict[str, Behaviour] = field(default_factory=dict)
    queue: list[Behaviour] = field(default_factory=list)
    records: list[RequestRecord] = field(default_factory=list)


def _chunk(model: str, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


class _Exchange:
    """One request/response on one connection."""

    def __init__(self, writer: asyncio.StreamWriter, record: RequestRecord, closed: asyncio.Event) -> None:
        self.writer = writer
        self.record = record
        self.closed = closed

    async def send(self, data: bytes) -> None:
        if self.closed.is_set():
            raise ConnectionResetError("client went away")
        self.writer.write(data)
        await self.writer.drain()

    async def http_error(self, status: int, message: str) -> None:
        self.record.status = status
        body = json.dumps({"error": {"message": message, "type": "server_error", "code": status}}).encode()
        extra = "Retry-After: 0\r\n" if status == 429 else ""
        head = (
            f"HTTP/1.1 {status} Error\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{extra}Connection: close\r\n\r\n"
        )
        await self.send(head.encode() + body)
        self.record.finished_at = time.monotonic()

    async def start_stream(self) -> None:
        await self.send(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )

    async def event(self, payload: str) -> None:
        data = f"data: {payload}\n\n".encode()
        await self.send(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    async def token(self, text: str) -> None:
        await self.event(json.dumps(_chunk(self.record.model, {"content": text})))
        self.record.tokens_sent += 1
        if self.record.first_token_at is None:
            self.record.first_token_at = time.monotonic()


async def _serve_stream(ex: _Exchange, b: Behaviour) -> None:
    body, model = ex.record.body, ex.record.model
    await ex.start_stream()
    await ex.event(json.dumps(_chunk(model, {"role": "assistant", "content": ""})))
    pieces = _WORDS.findall(b.text)
    limit = b.after_tokens if b.kind in ("malformed", "die") else len(pieces)
    for piece in pieces[:limit]:
        await asyncio.sleep(b.delay_s)
        await ex.token(piece)
    if b.kind == "malformed":
        await ex.event('{"id": "chatcmpl-test", "choices": [{"delta": {"content": "broken')
        await asyncio.sleep(b.delay_s)
    if b.kind == "die":
        ex.writer.transport.abort()
        ex.record.finished_at = time.monotonic()
        return
    await ex.event(json.dumps(_chunk(model, {}, b.finish_reason)))
    if (body.get("stream_options") or {}).get("include_usage"):
        prompt = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": len(pieces),
            "total_tokens": prompt + len(pieces),
        }
        await ex.event(json.dumps({**_chunk(model, {}), "choices": [], "usage": usage}))
    await ex.event("[DONE]")
    # The stream's content ends with [DONE]: a client may close the moment it reads it, before the
    # chunked-encoding terminator below goes out (which then finds the connection closed).
    ex.record.finished_at = time.monotonic()
    await ex.send(b"0\r\n\r\n")


async def _respond(ex: _Exchange, b: Behaviour) -> None:
    if b.reject_stream_options and "stream_options" in ex.record.body:
        await ex.http_error(400, "Unrecognized request argument supplied: stream_options")
    elif b.kind == "error":
        await ex.http_error(b.status, f"scripted HTTP {b.status}")
    elif b.kind == "hang":
        await ex.closed.wait()
    else:
        await _serve_stream(ex, b)


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return method, path, body


class ChatServer:
    """Start with `with ChatServer() as server:` (or start()/stop()); `server.url` is the
    base URL to give an OpenAI client ("http://127.0.0.1:PORT/v1")."""

    def __init__(self, default: Behaviour | None = None) -> None:
        self._state = _State(default or Behaviour.stream())
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def set_behaviour(self, model: str, behaviour: Behaviour) -> None:
        with self._lock:
            self._state.by_model[model] = behaviour

    def enqueue(self, *behaviours: Behaviour) -> None:
        with self._lock:
            self._state.queue.extend(behaviours)

    @property
    def requests(self) -> list[RequestRecord]:
        with self._lock:
            return [replace(r) for r in self._state.records]

    def wait_until(self, predicate: Any, timeout_s: float = 5.0) -> bool:
        """Polls predicate(requests) until true or the timeout; returns the last result."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate(self.requests):
                return True
            time.sleep(0.01)
        return bool(predicate(self.requests))

    def _pick(self, model: str) -> Behaviour:
        with self._lock:
            if model in self._state.by_model:
                return self._state.by_model[model]
            if self._state.queue:
                return self._state.queue.pop(0)
            return self._state.default

    async def _watch(self, reader: asyncio.StreamReader, record: RequestRecord, closed: asyncio.Event) -> None:
        try:
            while await reader.read(1024):
                pass
        except (ConnectionError, OSError):
            pass
        if record.finished_at is None:
            record.disconnected_at = time.monotonic()
        closed.set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        watcher: asyncio.Task[None] | None = None
        try:
            method, path, raw = await _read_request(reader)
            body = json.loads(raw or b"{}") if method == "POST" else {}
            model = str(body.get("model", ""))
            behaviour = self._pick(model)
            record = RequestRecord(model, body, behaviour, time.monotonic())
            with self._lock:
                self._state.records.append(record)
            closed = asyncio.Event()
            watcher = asyncio.create_task(self._watch(reader, record, closed))
            exchange = _Exchange(writer, record, closed)
            if (method, path) != ("POST", "/v1/chat/completions"):
                await exchange.http_error(404, f"no route {method} {path}")
            else:
                await _respond(exchange, behaviour)
        except (ConnectionError, OSError, asyncio.IncompleteReadError, ValueError):
            pass
        except asyncio.CancelledError:
            pass  # server shutdown
        finally:
            if watcher is not None:
                watcher.cancel()
            writer.close()
            self._tasks.discard(task)

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._server = loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        ready.set()
        loop.run_forever()
        loop.close()

    def start(self) -> ChatServer:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="chat-server", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("chat server did not start")
        return self

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        self._loop = self._thread = None

    def __enter__(self) -> ChatServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
