"""GroupLinger in MilvusConnection: under load a grouped write or read waits a moment, so a burst
of calls that reach the store a little apart leaves in one call; an isolated call does not wait."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest

from ragrpc.config import Settings
from ragrpc.store.factory import connection_for
from ragrpc.store.milvus_connection import GroupLinger, MilvusConnection


class RecordingClient:
    """Stands in for pymilvus' MilvusClient: records each call's rows (or keys)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Any]]] = []
        self._lock = threading.Lock()

    def upsert(self, collection: str, rows: list[dict[str, Any]]) -> dict[str, int]:
        with self._lock:
            self.calls.append(("upsert", [row["id"] for row in rows]))
        time.sleep(0.002)  # a store call takes a moment
        return {"upsert_count": len(rows)}

    def get(self, collection: str, ids: list[str], output_fields: list[str]) -> list[dict[str, Any]]:
        with self._lock:
            self.calls.append(("get", list(ids)))
        return [{"id": key} for key in ids]


def _connection(linger_s: float) -> tuple[MilvusConnection, RecordingClient]:
    connection = MilvusConnection("http://127.0.0.1:1", group_linger_s=linger_s)
    client = RecordingClient()
    connection._client = client  # the client it would connect; no server needed here
    return connection, client


def _burst(call: Any, count: int, spacing_s: float) -> None:
    threads = [threading.Thread(target=call, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
        time.sleep(spacing_s)
    for thread in threads:
        thread.join()


def test_a_burst_of_writes_a_little_apart_leaves_in_one_call() -> None:
    connection, client = _connection(linger_s=0.1)
    connection.write_rows("upsert", "docs", [{"id": "first"}], "id")  # writes are coming in
    _burst(lambda n: connection.write_rows("upsert", "docs", [{"id": f"d{n}"}], "id"), count=6, spacing_s=0.005)
    assert client.calls[0] == ("upsert", ["first"])
    assert client.calls[1:] == [("upsert", [f"d{n}" for n in range(6)])]


def test_without_a_linger_the_first_of_the_burst_leaves_alone() -> None:
    connection, client = _connection(linger_s=0.0)
    connection.write_rows("upsert", "docs", [{"id": "first"}], "id")
    _burst(lambda n: connection.write_rows("upsert", "docs", [{"id": f"d{n}"}], "id"), count=6, spacing_s=0.005)
    assert len(client.calls) > 2  # the baseline the linger improves on
    assert sorted(i for _, ids in client.calls[1:] for i in ids) == [f"d{n}" for n in range(6)]


def test_grouped_reads_linger_too() -> None:
    connection, client = _connection(linger_s=0.1)
    assert connection.get_rows("docs", ["k0"], ["id"], "id") == [{"id": "k0"}]
    found: dict[int, list[dict[str, Any]]] = {}

    def read(n: int) -> None:
        found[n] = connection.get_rows("docs", [f"k{n}"], ["id"], "id")

    _burst(read, count=5, spacing_s=0.005)
    assert found == {n: [{"id": f"k{n}"}] for n in range(5)}
    assert client.calls[1:] == [("get", [f"k{n}" for n in range(5)])]


def test_an_isolated_call_does_not_wait() -> None:
    connection, client = _connection(linger_s=5.0)  # a wait would be obvious
    started = time.monotonic()
    connection.write_rows("upsert", "docs", [{"id": "only"}], "id")
    connection.get_rows("docs", ["only"], ["id"], "id")  # a different kind: quiet as well
    assert time.monotonic() - started < 1.0
    assert client.calls == [("upsert", ["only"]), ("get", ["only"])]


def test_calls_after_a_quiet_spell_do_not_wait() -> None:
    linger = GroupLinger(0.05, busy_window_s=0.02)
    linger.wait("kind")
    time.sleep(0.05)  # longer than the busy window
    linger.wait("kind")
    assert linger.lingered == 0
    linger.wait("kind")  # right after the last one: busy
    assert linger.lingered == 1


def test_a_negative_linger_is_refused() -> None:
    with pytest.raises(ValueError, match="linger"):
        GroupLinger(-0.001)


def test_only_the_writer_lingers() -> None:
    settings = dataclasses.replace(Settings(), store_group_linger_ms=5.0)
    assert connection_for(settings, writer=True).group_linger_s == pytest.approx(0.005)
    assert connection_for(settings, writer=False).group_linger_s == 0.0  # queries never wait
    assert connection_for(dataclasses.replace(settings, store_group_linger_ms=0.0), writer=True).group_linger_s == 0.0


def test_a_negative_linger_setting_names_its_variable() -> None:
    with pytest.raises(ValueError, match="RAGRPC_STORE_GROUP_LINGER_MS"):
        connection_for(dataclasses.replace(Settings(), store_group_linger_ms=-1.0), writer=True)
