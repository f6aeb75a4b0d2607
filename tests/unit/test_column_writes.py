"""ColumnWrites (ragrpc.store.column_writes): inserted and upserted rows go to pymilvus' column path
with the collection's schema, described once and dropped after a failed write; rows of other shapes,
a field the schema lacks, or a client without the column path go as rows. (The round trip through a real milvus-lite
server is in tests/integration: test_store_contract, test_store_failures.)"""

from __future__ import annotations

from typing import Any

import pytest

from ragrpc.store.column_writes import ColumnWrites

SCHEMA = {"fields": [{"name": "id", "type": 21}, {"name": "n", "type": 5}, {"name": "v", "type": 101}]}


class Connection:
    def __init__(self) -> None:
        self.batches: list[tuple[str, list[dict[str, Any]], dict[str, Any]]] = []
        self.fail_next = False

    def batch_insert(self, collection: str, entities: list[dict[str, Any]], **kwargs: Any) -> str:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("collection not found")
        self.batches.append((collection, entities, kwargs))
        return "columns"

    def upsert(self, collection: str, entities: list[dict[str, Any]], **kwargs: Any) -> str:
        self.batches.append((collection, entities, {"upsert": True, **kwargs}))
        return "upserted columns"


class Client:
    """The parts of a MilvusClient the column path uses."""

    def __init__(self) -> None:
        self.connection = Connection()
        self.described: list[str] = []
        self.row_inserts: list[list[dict[str, Any]]] = []

    def _get_connection(self) -> Connection:
        return self.connection

    def _generate_call_context(self) -> str:
        return "context"

    def describe_collection(self, name: str) -> dict[str, Any]:
        self.described.append(name)
        return SCHEMA

    def insert(self, collection: str, rows: list[dict[str, Any]]) -> str:
        self.row_inserts.append(rows)
        return "rows"

    def upsert(self, collection: str, rows: list[dict[str, Any]]) -> str:
        self.row_inserts.append(rows)
        return "upserted rows"


def _rows(n: int) -> list[dict[str, Any]]:
    return [{"id": f"r{i}", "n": i, "v": [float(i), 0.5]} for i in range(n)]


def test_rows_go_as_columns_with_the_schema_described_once() -> None:
    inserts, client = ColumnWrites(), Client()
    assert inserts.insert(client, "chunks", _rows(3)) == "columns"
    assert inserts.insert(client, "chunks", _rows(2)) == "columns"
    assert client.described == ["chunks"] and client.row_inserts == []
    collection, columns, kwargs = client.connection.batches[0]
    assert collection == "chunks" and kwargs == {"context": "context", "schema": SCHEMA}
    assert columns == [
        {"name": "id", "type": 21, "values": ["r0", "r1", "r2"]},
        {"name": "n", "type": 5, "values": [0, 1, 2]},
        {"name": "v", "type": 101, "values": [[0.0, 0.5], [1.0, 0.5], [2.0, 0.5]]},
    ]


def test_a_failed_insert_drops_the_schema_so_the_next_one_describes_the_collection_again() -> None:
    inserts, client = ColumnWrites(), Client()
    inserts.insert(client, "chunks", _rows(1))
    client.connection.fail_next = True
    with pytest.raises(RuntimeError):
        inserts.insert(client, "chunks", _rows(1))
    inserts.insert(client, "chunks", _rows(1))
    assert client.described == ["chunks", "chunks"]
    inserts.forget()
    inserts.insert(client, "chunks", _rows(1))
    assert client.described == ["chunks", "chunks", "chunks"]


def test_rows_of_other_shapes_or_with_an_unknown_field_go_as_rows() -> None:
    inserts, client = ColumnWrites(), Client()
    mixed = _rows(2)
    del mixed[1]["n"]
    assert inserts.insert(client, "chunks", mixed) == "rows"
    extra = [{**row, "dynamic": 1} for row in _rows(2)]
    assert inserts.insert(client, "chunks", extra) == "rows"
    assert client.row_inserts == [mixed, extra] and client.connection.batches == []
    assert not inserts.by_rows  # still columns for the next well-formed rows
    assert inserts.insert(client, "chunks", _rows(1)) == "columns"


def test_a_client_without_the_column_path_inserts_rows() -> None:
    class RowsOnly:
        def __init__(self) -> None:
            self.rows: list[dict[str, Any]] = []

        def insert(self, collection: str, rows: list[dict[str, Any]]) -> str:
            self.rows.extend(rows)
            return "rows"

    inserts, client = ColumnWrites(), RowsOnly()
    assert inserts.insert(client, "chunks", _rows(2)) == "rows"
    assert inserts.by_rows and len(client.rows) == 2


def test_upserts_go_as_columns_too_and_rows_when_they_cannot() -> None:
    inserts, client = ColumnWrites(), Client()
    assert inserts.upsert(client, "registry", _rows(2)) == "upserted columns"
    collection, columns, kwargs = client.connection.batches[0]
    assert collection == "registry" and kwargs["upsert"] and kwargs["schema"] is SCHEMA
    assert [column["values"] for column in columns][0] == ["r0", "r1"]
    extra = [{**row, "dynamic": 1} for row in _rows(1)]
    assert inserts.upsert(client, "registry", extra) == "upserted rows"
    assert inserts.calls == 1
