"""A scan (ragrpc.store.paging) whose pages of rows are over the store's answer limit: milvus-lite
answers at most 256 MB, which 8,192 chunks of 30 KB reach; here a real milvus-lite server whose limit is
lowered to 1 MiB, with rows of 20 KB, so that a page of 64 of them is over it. A refused page is read
again in halves, by the scan's first query, by an iterator (started again after the last row it
returned) and by a keyed scan's `get`; every row comes back once, in key order. The same on a real
Milvus 2.3.5 server (its query iterator), where the client's own receive limit is lowered to 1 MiB."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from pymilvus import DataType, MilvusClient

from ragrpc import errors
from ragrpc.store import paging
from ragrpc.store.filters import FilterBuilder, FilterExpr
from ragrpc.store.milvus_connection import MilvusConnection
from tests.integration.test_keyed_scan_answer_limit import CountingConnection
from tests.integration.test_store_failures import StatusError
from tests.support.milvus235 import running_or_skipped
from tests.support.milvus_server import start_milvus_lite

pytestmark = pytest.mark.slow

LIMIT = 1 << 20
SMALL, LARGE = 150, 150  # rows of 100 bytes (keys "a..."), then rows of 20,000 bytes (keys "b...")
LARGE_BYTES = 20_000
COLLECTION = "pages"
BUILDER = FilterBuilder({"chunk_id": str, "grp": str})
EVERY_ROW = BUILDER.ne("grp", "")
LARGE_ONLY = BUILDER.eq("grp", "large")


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = start_milvus_lite(Path(tmp_path_factory.mktemp("milvus")), answer_limit_bytes=LIMIT)
    try:
        _fill(MilvusClient(uri=server.uri))
        yield server.uri
    finally:
        server.stop()


@pytest.fixture(scope="module")
def uri_235(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_or_skipped(tmp_path_factory.mktemp("milvus235"), "Milvus 2.3.5 page halving") as server:
        _fill(MilvusClient(uri=server.uri), consistency_level="Strong")
        yield server.uri


class ClientLimitedConnection(CountingConnection):
    """A real connection whose client refuses answers over LIMIT (gRPC: "Received message larger than max").
    pymilvus shares one channel among the clients of an address and token, made with the first one's options,
    so this client names a token of its own (the server, without authentication, ignores it)."""

    def _connect(self) -> Any:
        return MilvusClient(
            uri=self.uri,
            token="client-limited",
            timeout=self.timeout_s,
            grpc_options={b"grpc.max_receive_message_length": LIMIT},  # pymilvus' own key for it is bytes
        )


def _fill(client: MilvusClient, **create: Any) -> None:
    try:
        fields = client.create_schema(auto_id=False)
        fields.add_field("chunk_id", DataType.VARCHAR, is_primary=True, max_length=64)
        fields.add_field("grp", DataType.VARCHAR, max_length=8)
        fields.add_field("body", DataType.VARCHAR, max_length=65535)
        fields.add_field("v", DataType.FLOAT_VECTOR, dim=2)
        index = client.prepare_index_params()
        index.add_index("v", index_type="FLAT", metric_type="COSINE")
        client.create_collection(COLLECTION, schema=fields, index_params=index, **create)
        small = [{"chunk_id": f"a{i:05d}", "grp": "small", "body": "s" * 100, "v": [1.0, 0.5]} for i in range(SMALL)]
        large = [
            {"chunk_id": f"b{i:05d}", "grp": "large", "body": chr(97 + i % 26) * LARGE_BYTES, "v": [0.5, 1.0]}
            for i in range(LARGE)
        ]
        rows = small + large
        for start in range(0, len(rows), 20):  # each insert under the lowered limit too
            client.insert(COLLECTION, rows[start : start + 20])
    finally:
        client.close()


def _scan(conn: MilvusConnection, expr: FilterExpr, page_size: int, by_key: str = "") -> list[list[dict[str, Any]]]:
    return list(
        paging.scan_rows(
            conn,
            COLLECTION,
            expr,
            ["chunk_id", "grp", "body"],
            page_size=page_size,
            operation="test scan",
            by_key=by_key,
        )
    )


def _expected(small: bool = True) -> list[str]:
    return ([f"a{i:05d}" for i in range(SMALL)] if small else []) + [f"b{i:05d}" for i in range(LARGE)]


def _halvings(caplog: pytest.LogCaptureFixture) -> int:
    return sum("is over the store's answer limit; reading it in pages of" in r.getMessage() for r in caplog.records)


def _check(pages: list[list[dict[str, Any]]], keys: list[str]) -> None:
    rows = [row for page in pages for row in page]
    assert [row["chunk_id"] for row in rows] == keys  # each once, in key order
    for row in rows:
        large = row["chunk_id"].startswith("b")
        assert row["body"] == (chr(97 + int(row["chunk_id"][1:]) % 26) * LARGE_BYTES if large else "s" * 100)


@pytest.mark.parametrize("by_key", ["", "chunk_id"], ids=["iterator", "keyed"])
def test_pages_over_the_answer_limit_are_read_in_halves(
    uri: str, by_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    conn = CountingConnection(uri)
    with caplog.at_level(logging.WARNING, logger=paging.__name__):
        pages = _scan(conn, EVERY_ROW, page_size=128, by_key=by_key)
    _check(pages, _expected())
    assert _halvings(caplog) >= 1  # a page of 128 rows with large ones was refused (an iterator's refusals
    # do not pass through the connection's call, so the log counts them)


@pytest.mark.parametrize("by_key", ["", "chunk_id"], ids=["iterator", "keyed"])
def test_a_first_query_over_the_answer_limit_is_asked_again_with_half_the_page(
    uri: str, by_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    conn = CountingConnection(uri)
    with caplog.at_level(logging.WARNING, logger=paging.__name__):
        pages = _scan(conn, LARGE_ONLY, page_size=256, by_key=by_key)  # 150 large rows: 3 MB in the first query
    _check(pages, _expected(small=False))
    assert conn.too_large >= 2  # the first query of 256 and of 128 rows refused
    assert "a page of 256 rows of pages is over the store's answer limit; reading it in pages of 128" in caplog.text


def test_one_row_over_the_answer_limit_is_an_internal_error_that_names_the_limit() -> None:
    refused = StatusError(grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max (1360031 vs. 1048576)")
    with pytest.raises(errors.InternalError, match="over the store's message limit"):
        paging._halved(refused, 1, "scan_chunks", "chunks")
    assert paging._halved(refused, 9, "scan_chunks", "chunks") == 4


@pytest.mark.timeout(600)
def test_pages_over_the_client_limit_are_read_in_halves_on_milvus_235(
    uri_235: str, caplog: pytest.LogCaptureFixture
) -> None:
    conn = ClientLimitedConnection(uri_235)
    with caplog.at_level(logging.WARNING, logger=paging.__name__):
        _check(_scan(conn, EVERY_ROW, page_size=128), _expected())  # the server's query iterator, restarted
        _check(_scan(conn, LARGE_ONLY, page_size=256), _expected(small=False))
    assert conn.too_large >= 2  # the first query of 256 and of 128 large rows refused by the client
    assert _halvings(caplog) >= 3
