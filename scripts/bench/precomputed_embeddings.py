"""An OpenAI-compatible embeddings server that costs (almost) nothing: the ingest_ceiling bench's
stand-in for a fast GPU endpoint, so that what it measures is the ingest service and the store.

    python -m scripts.bench.precomputed_embeddings --port P [--dimension 384] [--pool 4096]

It answers `POST /v1/embeddings` as the OpenAI API does (`{"object": "list", "data": [{"object":
"embedding", "index": i, "embedding": ...}], "model": ..., "usage": ...}`), as JSON floats or base64
(`encoding_format`). The vectors are precomputed: a pool of random unit vectors, each already
serialised in both encodings, and a text gets the one its CRC-32 picks, so the same text always gets
the same vector and an answer is a string join. It runs as a process of its own (its CPU is counted
apart from the service's) with one thread per connection, and prints `READY <port>` once it listens.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np


class VectorPool:
    """`size` random unit vectors of `dimension` float32 components, serialised once."""

    def __init__(self, dimension: int, size: int, seed: int = 11) -> None:
        rng = np.random.default_rng(seed)
        vectors = rng.normal(size=(size, dimension)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        self.dimension = dimension
        self.as_base64 = [json.dumps(base64.b64encode(v.astype("<f4").tobytes()).decode()) for v in vectors]
        self.as_floats = [json.dumps([float(x) for x in v]) for v in vectors]

    def answer(self, texts: list[str], model: str, encoding: str) -> bytes:
        pool = self.as_base64 if encoding == "base64" else self.as_floats
        size = len(pool)
        items = ",".join(
            f'{{"object":"embedding","index":{i},"embedding":{pool[zlib.crc32(t.encode()) % size]}}}'
            for i, t in enumerate(texts)
        )
        tokens = sum(len(t) for t in texts) // 4
        usage = f'{{"prompt_tokens":{tokens},"total_tokens":{tokens}}}'
        return f'{{"object":"list","data":[{items}],"model":{json.dumps(model)},"usage":{usage}}}'.encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the openai client expects
    server: _Server

    def do_POST(self) -> None:  # noqa: N802 - the http.server naming
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != "/v1/embeddings":
            self._send(404, b'{"error":{"message":"no such route","type":"invalid_request_error"}}')
            return
        try:
            body: dict[str, Any] = json.loads(raw or b"{}")
            texts = body.get("input", [])
            texts = [texts] if isinstance(texts, str) else [str(t) for t in texts]
            wanted = body.get("dimensions") or self.server.pool.dimension
        except (ValueError, TypeError):
            self._send(400, b'{"error":{"message":"malformed request","type":"invalid_request_error"}}')
            return
        if wanted != self.server.pool.dimension:
            self._send(400, b'{"error":{"message":"unsupported dimensions","type":"invalid_request_error"}}')
            return
        self._send(200, self.server.pool.answer(texts, str(body.get("model", "")), str(body.get("encoding_format"))))

    def _send(self, status: int, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        return


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    pool: VectorPool


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--dimension", type=int, default=384)
    parser.add_argument("--pool", type=int, default=4096, help="distinct vectors served")
    args = parser.parse_args(argv)
    server = _Server(("127.0.0.1", args.port), _Handler)
    server.pool = VectorPool(args.dimension, args.pool)
    print(f"READY {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
