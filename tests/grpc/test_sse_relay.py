"""The SSE relay example: an HTTP endpoint relaying the Ask stream of the real query service."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from clients import AsyncIngestClient
from clients.examples.sse_relay import RelayServer, make_relay_server
from tests.grpc.test_client_sync import BREAD_TXT, MILVUS_MD


@contextmanager
def _relay(query_address: str) -> Iterator[RelayServer]:
    server = make_relay_server(query_address)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def parse_sse(body: str) -> list[tuple[str, dict]]:
    events = []
    for frame in body.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in frame.splitlines() if ": " in line)
        if fields:
            events.append((fields["event"], json.loads(fields["data"])))
    return events


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


async def test_relays_ask_events_as_server_sent_events(fake_stack) -> None:
    async with AsyncIngestClient(fake_stack.ingest_address) as ingest:
        await ingest.upload(MILVUS_MD.encode(), file_name="milvus.md")
        await ingest.upload(BREAD_TXT.encode(), file_name="bread.txt")
    with _relay(fake_stack.query_address) as server:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        question = f"{base}/ask?q=What+does+Milvus+store%3F&top_k=2"
        status, content_type, body = await asyncio.to_thread(_get, question)
        bad_status, _, bad_body = await asyncio.to_thread(_get, f"{base}/ask?q=")
        missing_status, _, _ = await asyncio.to_thread(_get, f"{base}/other")
    assert status == 200 and content_type.startswith("text/event-stream")
    events = parse_sse(body)
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "source" and kinds[-1] == "final" and kinds.count("final") == 1
    first_token = kinds.index("token")
    assert set(kinds[:first_token]) == {"source"} and len(kinds[:first_token]) <= 2
    assert all(kind in ("token", "citation") for kind in kinds[first_token:-1])
    assert kinds.index("citation") > first_token if "citation" in kinds else True
    final = events[-1][1]
    tokens = "".join(data["text"] for kind, data in events if kind == "token")
    assert final["model"] == "extractive" and final["answer"] == tokens and "Milvus" in tokens
    assert events[0][1]["number"] == 1 and events[0][1]["chunk"]["source"] == "milvus.md"
    assert bad_status == 400 and json.loads(bad_body)["error"]["code"] == "INVALID_ARGUMENT"
    assert missing_status == 404
