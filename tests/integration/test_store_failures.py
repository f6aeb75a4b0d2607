"""Store failures are classified by the client's types and status codes, and a repeated insert can
never duplicate rows: against a scripted client (regular) and a real milvus-lite server whose
reply to an insert that landed is lost (slow)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from pymilvus import MilvusException
from pymilvus.exceptions import ConnectError, MilvusUnavailableException

from ragrpc import errors
from ragrpc.store.failures import Failure, classify
from ragrpc.store.milvus_connection import MilvusConnection, translate_exception


class StatusError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str = "") -> None:
        super().__init__(details)
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return str(self)


def _wrapped(cause: BaseException) -> MilvusException:
    """As pymilvus raises after its own retries: a MilvusException caused by the gRPC error."""
    try:
        raise MilvusException(message="Retry run out of 75 retry times") from cause
    except MilvusException as exc:
        return exc


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (StatusError(grpc.StatusCode.UNAVAILABLE), Failure.UNAVAILABLE),
        (StatusError(grpc.StatusCode.DEADLINE_EXCEEDED), Failure.UNAVAILABLE),
        (StatusError(grpc.StatusCode.RESOURCE_EXHAUSTED), Failure.UNAVAILABLE),
        (
            StatusError(
                grpc.StatusCode.RESOURCE_EXHAUSTED, "SERVER: Sent message larger than max (1360031 vs. 1048576)"
            ),
            Failure.TOO_LARGE,
        ),
        (
            _wrapped(StatusError(grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max (9 vs. 4)")),
            Failure.TOO_LARGE,
        ),
        (StatusError(grpc.StatusCode.UNAVAILABLE, "message larger than max"), Failure.UNAVAILABLE),
        (StatusError(grpc.StatusCode.INVALID_ARGUMENT, "connection timeout in the text"), Failure.REFUSED),
        (grpc.FutureTimeoutError(), Failure.UNAVAILABLE),
        (ConnectError(message="x"), Failure.UNAVAILABLE),
        (MilvusUnavailableException(message="x"), Failure.UNAVAILABLE),
        (MilvusException(code=2, message="Fail connecting to server"), Failure.UNAVAILABLE),
        (MilvusException(code=8, message="rate limit exceeded"), Failure.UNAVAILABLE),
        (MilvusException(code=101, message="collection not loaded"), Failure.RELEASED),
        (MilvusException(code=1100, message="deadline of the field is invalid"), Failure.REFUSED),
        (MilvusException(code=65535, message="failed to connect the dots in the schema"), Failure.REFUSED),
        (_wrapped(StatusError(grpc.StatusCode.UNAVAILABLE)), Failure.UNAVAILABLE),
        (ConnectionResetError("reset by peer"), Failure.UNAVAILABLE),
        (ValueError("timeout"), Failure.REFUSED),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_failures_are_classified_by_type_and_code_not_by_wording(exc: BaseException, expected: Failure) -> None:
    assert classify(exc) is expected


def test_an_answer_over_the_message_limit_is_internal_and_not_repeated() -> None:
    """Asking again for the same answer cannot help: the call is not repeated after a reconnect."""
    too_large = StatusError(grpc.StatusCode.RESOURCE_EXHAUSTED, "SERVER: Sent message larger than max (9 vs. 4)")
    error = translate_exception(too_large, "scan")
    assert isinstance(error, errors.InternalError) and "over the store's message limit" in error.message
    assert "Sent message" not in error.message and error.reason == "STORE_MESSAGE_TOO_LARGE"
    calls: list[int] = []

    def answer(_client: Any) -> None:
        calls.append(1)
        raise too_large

    conn = ScriptedConnection(ScriptedClient())
    with pytest.raises(StatusError):
        conn.call(answer)
    assert calls == [1]


def test_a_refusal_worded_like_an_outage_is_a_refusal_not_unavailable() -> None:
    error = translate_exception(MilvusException(code=1100, message="request timeout value is invalid"), "scan")
    assert isinstance(error, errors.InternalError) and error.reason == "STORE_REFUSED"
    assert isinstance(translate_exception(StatusError(grpc.StatusCode.UNAVAILABLE), "insert"), errors.UnavailableError)


@pytest.mark.parametrize(
    ("operation", "code", "expected", "reason"),
    [
        ("insert", 1100, errors.InvalidInputError, "STORE_REFUSED_DATA"),
        ("upsert", 65535, errors.InvalidInputError, "STORE_REFUSED_DATA"),
        ("query", 1100, errors.InternalError, "STORE_REFUSED"),
        ("search", 100, errors.PreconditionError, "STORE_COLLECTION_MISSING"),
    ],
)
def test_refusals_get_a_code_and_a_message_naming_no_internal_object(
    operation: str, code: int, expected: type, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    raw = MilvusException(code=code, message="collection ragrpc_chunks: expr 'tenant == \"a\"' is invalid")
    error = translate_exception(raw, operation)
    assert type(error) is expected and error.reason == reason
    for internal in ("ragrpc_chunks", "expr", "tenant", "MilvusException"):
        assert internal not in error.message
    assert "ragrpc_chunks" in caplog.text  # the details are in the service log


class ScriptedClient:
    """Keeps rows by primary key, like a collection; can lose the reply of its next insert."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.lose_next_reply = False
        self.fail_next_before_applying = False
        self.inserts = 0

    def insert(self, collection: str, rows: list[dict[str, Any]]) -> dict[str, int]:
        self.inserts += 1
        if self.fail_next_before_applying:
            self.fail_next_before_applying = False
            raise StatusError(grpc.StatusCode.UNAVAILABLE, "connection refused")
        self.rows.extend(rows)  # Milvus keeps a duplicate primary key as a second row
        if self.lose_next_reply:
            self.lose_next_reply = False
            raise StatusError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")
        return {"insert_count": len(rows)}

    def get(self, collection: str, ids: list[Any], output_fields: list[str]) -> list[dict[str, Any]]:
        wanted = set(ids)
        return [{"id": row["id"]} for row in self.rows if row["id"] in wanted]

    def close(self) -> None:
        pass


class ScriptedConnection(MilvusConnection):
    def __init__(self, client: ScriptedClient) -> None:
        super().__init__("http://127.0.0.1:1", group_linger_s=0)
        self.scripted = client

    def _connect(self) -> Any:
        return self.scripted


def _rows(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"id": f"c{i}", "text": f"chunk {i}"} for i in range(start, start + n)]


def test_an_insert_whose_reply_was_lost_is_not_written_twice() -> None:
    client = ScriptedClient()
    connection = ScriptedConnection(client)
    client.lose_next_reply = True
    connection.write_rows("insert", "chunks", _rows(2500), "id")  # more rows than one existence read
    assert sorted(r["id"] for r in client.rows) == sorted(r["id"] for r in _rows(2500))
    assert client.inserts == 1  # everything had landed: nothing to write again


def test_an_insert_that_did_not_land_is_written_on_the_repeat() -> None:
    client = ScriptedClient()
    connection = ScriptedConnection(client)
    client.fail_next_before_applying = True
    connection.write_rows("insert", "chunks", _rows(10), "id")
    assert len(client.rows) == 10 and client.inserts == 2


def test_an_insert_that_partly_landed_writes_only_the_rest() -> None:
    client = ScriptedClient()
    connection = ScriptedConnection(client)
    client.rows.extend(_rows(4))  # as if the server had applied part of it before failing
    client.fail_next_before_applying = True
    connection.write_rows("insert", "chunks", _rows(10), "id")
    assert sorted(r["id"] for r in client.rows) == sorted(r["id"] for r in _rows(10))


@pytest.mark.slow
def test_on_milvus_lite_a_lost_insert_reply_does_not_duplicate_chunks(milvus_settings: Any) -> None:
    import dataclasses

    from ragrpc.models import ChunkRecord
    from ragrpc.store import filters as f
    from ragrpc.store import schema as s
    from ragrpc.store.factory import open_milvus_stores
    from ragrpc.testing import HashingEmbedder

    embedder = HashingEmbedder(dimension=32)
    settings = dataclasses.replace(milvus_settings)
    stores = open_milvus_stores(settings, model_id=embedder.model_id, dimension=embedder.dimension, writer=True)
    connection = stores.connection
    real_insert = connection.column_writes.insert  # the connection's insert call (column by column)
    lost = {"done": False}

    def insert_then_lose_the_reply(milvus: Any, collection: str, rows: list[dict[str, Any]]) -> Any:
        result = real_insert(milvus, collection, rows)
        if not lost["done"]:
            lost["done"] = True
            raise StatusError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")
        return result

    connection.column_writes.insert = insert_then_lose_the_reply  # type: ignore[method-assign]
    connection.reset = lambda: None  # keep the patched client for the repeat
    texts = [f"chunk {i} of the ledger" for i in range(40)]
    vectors = embedder.embed_documents(texts)
    chunks = [
        ChunkRecord(f"d1-g1-{i}", "d1", "t1", "default", "g1", text, list(map(float, vector)), i, "fixed")
        for i, (text, vector) in enumerate(zip(texts, vectors, strict=True))
    ]
    stores.chunks.insert_chunks(chunks)
    assert lost["done"]
    stored = stores.chunks.count_chunks(f.eq(s.TENANT, chunks[0].tenant))
    assert stored == 40
    assert not connection.column_writes.by_rows  # the column path ran, not pymilvus' row insert
