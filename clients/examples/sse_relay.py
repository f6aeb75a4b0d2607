"""Example: another service relaying the Ask stream to browsers as server-sent events.

    python -m clients.examples.sse_relay --query 127.0.0.1:50052 --port 8080
    curl -N 'http://127.0.0.1:8080/ask?q=what+is+milvus&top_k=3'

`GET /ask?q=...` answers `text/event-stream` with one SSE event per Ask event, in order:

    event: source | token | retraction | citation | final
    data: {json of the event}

Query parameters besides `q`: top_k, mode, fusion, collection, template, tag (repeatable).
Errors before the first event become an HTTP status with a JSON body (400 for
INVALID_ARGUMENT, 503 for UNAVAILABLE, ...); an error mid-stream becomes `event: error`.
When the browser disconnects, the gRPC call is cancelled, which stops generation upstream.
Standard library only (http.server), one thread per request over one shared gRPC channel.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import grpc

from clients.errors import RagrpcClientError
from clients.sync_client import RetrieveClient

_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: HTTPStatus.BAD_REQUEST,
    grpc.StatusCode.NOT_FOUND: HTTPStatus.NOT_FOUND,
    grpc.StatusCode.UNAUTHENTICATED: HTTPStatus.UNAUTHORIZED,
    grpc.StatusCode.RESOURCE_EXHAUSTED: HTTPStatus.TOO_MANY_REQUESTS,
    grpc.StatusCode.UNAVAILABLE: HTTPStatus.SERVICE_UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: HTTPStatus.GATEWAY_TIMEOUT,
}


def sse_frame(event: str, data: dict[str, Any]) -> bytes:
    """One server-sent event (the JSON has no newlines, so one data line suffices)."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def ask_options(query: dict[str, list[str]]) -> dict[str, Any]:
    """Ask options from the URL's query parameters."""
    first = {name: values[0] for name, values in query.items() if values and values[0]}
    options: dict[str, Any] = {
        name: first[name] for name in ("mode", "fusion", "collection", "template") if name in first
    }
    if "top_k" in first:
        options["top_k"] = int(first["top_k"])
    if query.get("tag"):
        options["tags"] = query["tag"]
    return options


class RelayServer(ThreadingHTTPServer):
    """HTTP server holding one RetrieveClient for all requests."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], client: RetrieveClient) -> None:
        super().__init__(address, AskRelayHandler)
        self.client = client

    def server_close(self) -> None:
        super().server_close()
        self.client.close()


class AskRelayHandler(BaseHTTPRequestHandler):
    server: RelayServer

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        url = urlsplit(self.path)
        if url.path != "/ask":
            self._send_json(HTTPStatus.NOT_FOUND, {"error": "only GET /ask?q=... is served"})
            return
        query = parse_qs(url.query)
        try:
            options = ask_options(query)
        except ValueError as err:
            self._send_json(HTTPStatus.BAD_REQUEST, {"error": str(err)})
            return
        request_id = self.headers.get("x-request-id") or None
        with self.server.client.ask(query.get("q", [""])[0], request_id=request_id, **options) as stream:
            self._relay(stream)

    def _relay(self, stream: Iterator[Any]) -> None:
        try:
            first = next(stream, None)  # errors before any event become an HTTP status
        except RagrpcClientError as err:
            self._send_json(_HTTP_STATUS.get(err.code, HTTPStatus.BAD_GATEWAY), {"error": err.to_dict()})
            return
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        events: Iterator[Any] = itertools.chain([first], stream) if first is not None else iter(())
        try:
            for event in events:
                self._write(sse_frame(event.kind, event.to_dict()))
        except RagrpcClientError as err:
            self._write(sse_frame("error", err.to_dict()))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the browser left; leaving the `with` block cancels the call

    def _write(self, frame: bytes) -> None:
        self.wfile.write(frame)
        self.wfile.flush()

    def _send_json(self, status: HTTPStatus, body: dict[str, Any]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        pass  # quiet; a real service would log through its own logger


def make_relay_server(query_target: str, host: str = "127.0.0.1", port: int = 0, **client_options: Any) -> RelayServer:
    """The relay bound to (host, port); port 0 picks a free one (see `server_address`)."""
    return RelayServer((host, port), RetrieveClient(query_target, **client_options))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Relay ragrpc Ask streams as server-sent events.")
    parser.add_argument("--query", default="127.0.0.1:50052", help="RetrieveService address")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    server = make_relay_server(args.query, args.host, args.port)
    print(f"relaying Ask from {args.query} on http://{args.host}:{server.server_address[1]}/ask?q=...")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
