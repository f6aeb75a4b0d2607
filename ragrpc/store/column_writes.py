"""Inserts and upserts sent column by column.

`MilvusClient.insert` and `upsert` take rows and pymilvus packs them into the request field by field
and row by row: for a chunk row (23 fields, a 384-d vector) about 0.115 ms of client CPU, on the ingest
service's interpreter lock and inside the one writer's call. Packed a column at a time (pymilvus'
own column path, which its ORM `Collection.insert` uses) the same rows take about 0.019 ms each
(1,024 rows of the chunks schema packed by pymilvus 3.0.2 on this project's 2-core machine; the
ingest ceiling this moved is in docs/benchmarks.md).

MilvusClient has no column insert or upsert, so this calls the column path of the client's
connection with the collection's schema (described once per collection and kept; dropped after a
failed write, in case the collection was recreated). A pymilvus without that path writes rows.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

logger = logging.getLogger(__name__)


class ColumnWrites:
    """Row inserts and upserts sent as columns, through one MilvusClient."""

    def __init__(self) -> None:
        self._schemas: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}  # description, types
        self._lock = threading.Lock()
        self.by_rows = False  # this pymilvus has no column path: rows it is (logged once)
        self.calls = 0  # writes sent as columns (for tests)

    def forget(self) -> None:
        """Drops the kept schemas (a new client, a recreated collection)."""
        with self._lock:
            self._schemas.clear()

    def insert(self, milvus: Any, collection: str, rows: list[dict[str, Any]]) -> Any:
        """Inserts the rows into the collection."""
        return self._write("insert", "batch_insert", milvus, collection, rows)

    def upsert(self, milvus: Any, collection: str, rows: list[dict[str, Any]]) -> Any:
        """Upserts the rows into the collection."""
        return self._write("upsert", "upsert", milvus, collection, rows)

    def _write(self, by_rows: str, by_columns: str, milvus: Any, collection: str, rows: list[dict[str, Any]]) -> Any:
        get_connection = getattr(milvus, "_get_connection", None)
        send = getattr(get_connection(), by_columns, None) if not self.by_rows and get_connection else None
        if send is None:
            self._rows_it_is()
            return getattr(milvus, by_rows)(collection, rows)
        schema, types = self._schema(milvus, collection)
        fields = rows[0].keys()
        if any(name not in types for name in fields) or any(row.keys() != fields for row in rows):
            return getattr(milvus, by_rows)(collection, rows)  # a field the schema lacks, or rows of other shapes
        columns = [{"name": name, "type": types[name], "values": [row[name] for row in rows]} for name in fields]
        try:
            result = send(
                collection,
                columns,
                context=milvus._generate_call_context(),  # noqa: SLF001 - the database its Session timestamps name
                schema=schema,
            )
        except Exception:
            with self._lock:
                self._schemas.pop(collection, None)
            raise
        self.calls += 1
        return result

    def _schema(self, milvus: Any, collection: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The collection's description and its fields' types, described once."""
        with self._lock:
            kept = self._schemas.get(collection)
        if kept is None:
            schema = milvus.describe_collection(collection)
            kept = schema, {field["name"]: field["type"] for field in schema["fields"]}
            with self._lock:
                self._schemas[collection] = kept
        return kept

    def _rows_it_is(self) -> None:
        if not self.by_rows:
            self.by_rows = True
            logger.info("this pymilvus has no column write path; inserts and upserts are packed row by row")
