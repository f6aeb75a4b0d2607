"""A keyed scan on milvus-lite (ragrpc.store.paging) whose keys are more than one answer of the store
holds: milvus-lite answers at most 256 MB, here a real milvus-lite server whose limit is lowered to
1 MiB, so that 40,000 matching 32-character keys (1.4 MB) are over it. Every matching row still comes
back, in key order: from ranges planned on the first page's keys, from ranges split again when an
answer is refused, or from an iterator when no key of the first page splits a refused range."""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pymilvus import DataType, MilvusClient

from ragrpc.store import paging
from ragrpc.store.failures import is_answer_too_large
from ragrpc.store.filters import FilterBuilder
from ragrpc.store.milvus_connection import MilvusConnection
from tests.support.milvus_server import start_milvus_lite

pytestmark = pytest.mark.slow

LIMIT = 1 << 20
ROWS = 60_000
COLLECTION = "keyed"
BUILDER = FilterBuilder({"pk": str, "grp": str})
IN_GROUP_A = BUILDER.eq("grp", "a")


class CountingConnection(MilvusConnection):
    """A real connection that counts the store's refusals of an answer over its limit."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.too_large = 0

    def call(self, fn: Any, *, repeat: Any = None) -> Any:
        try:
            return super().call(fn, repeat=repeat)
        except Exception as exc:
            self.too_large += is_answer_too_large(exc)
            raise


@pytest.fixture(scope="module")
def server_and_keys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str]]]:
    server = start_milvus_lite(Path(tmp_path_factory.mktemp("milvus")), answer_limit_bytes=LIMIT)
    client = MilvusClient(uri=server.uri)
    try:
        fields = client.create_schema(auto_id=False)
        fields.add_field("pk", DataType.VARCHAR, is_primary=True, max_length=64)
        fields.add_field("grp", DataType.VARCHAR, max_length=8)
        fields.add_field("v", DataType.FLOAT_VECTOR, dim=2)
        index = client.prepare_index_params()
        index.add_index("v", index_type="FLAT", metric_type="COSINE")
        client.create_collection(COLLECTION, schema=fields, index_params=index)
        rng = random.Random(7)
        keys = [f"{rng.getrandbits(128):032x}" for _ in range(ROWS)]
        rows = [{"pk": key, "grp": "a" if i % 3 else "b", "v": [1.0, 0.5]} for i, key in enumerate(keys)]
        for start in range(0, ROWS, 10_000):
            client.insert(COLLECTION, rows[start : start + 10_000])
        yield server.uri, sorted(key for i, key in enumerate(keys) if i % 3)
    finally:
        client.close()
        server.stop()


def _scan(conn: MilvusConnection, fields: list[str], page_size: int, **kwargs: Any) -> list[dict[str, Any]]:
    pages = paging.scan_rows(
        conn, COLLECTION, IN_GROUP_A, fields, page_size=page_size, operation="test scan", by_key="pk", **kwargs
    )
    return [row for page in pages for row in page]


def test_every_key_over_the_answer_limit_comes_back_in_key_order(server_and_keys: tuple[str, list[str]]) -> None:
    uri, expected = server_and_keys
    assert len(expected) * 34 > LIMIT  # one answer of every key is over the server's limit
    conn = CountingConnection(uri)
    keys = [row["pk"] for row in _scan(conn, ["pk"], page_size=4096)]
    assert keys == expected
    assert conn.too_large >= 1  # planned as one range (the default budget), refused, split at the page's keys

    rows = _scan(conn, ["pk", "grp"], page_size=8192)
    assert [row["pk"] for row in rows] == expected and {row["grp"] for row in rows} == {"a"}


def test_ranges_planned_from_the_first_page_stay_under_the_budget(server_and_keys: tuple[str, list[str]]) -> None:
    uri, expected = server_and_keys
    conn = CountingConnection(uri)
    keys = [row["pk"] for row in _scan(conn, ["pk"], page_size=4096, key_answer_bytes=200_000)]
    assert keys == expected
    assert conn.too_large == 0


def test_a_refused_range_no_key_of_the_first_page_splits_is_read_with_an_iterator(
    server_and_keys: tuple[str, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    uri, expected = server_and_keys
    conn = CountingConnection(uri)
    ranges = paging._KeyRanges(
        conn, COLLECTION, IN_GROUP_A, "pk", "test scan", sample=[], rows=ROWS, answer_bytes=LIMIT
    )
    with caplog.at_level(logging.WARNING, logger=paging.__name__):
        assert ranges.keys() == expected  # more than one iterator page (MAX_QUERY_WINDOW keys)
    assert conn.too_large == 1
    assert "reading them with an iterator" in caplog.text
