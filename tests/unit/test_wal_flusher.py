"""WalFlusher: when the writer flushes (writes paused, or too long unflushed), what `auto` means,
and that a store error only postpones the flush."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from ragrpc import errors
from ragrpc.store.wal_flusher import WalFlusher, flush_enabled


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Connection:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.unflushed_since: float | None = None
        self.last_write_at = 0.0
        self.flushed: list[list[str]] = []
        self.fail: errors.RagrpcError | None = None

    def write(self) -> None:
        self.last_write_at = self.clock.now
        if self.unflushed_since is None:
            self.unflushed_since = self.clock.now

    def flush(self, names: Sequence[str]) -> None:
        if self.fail is not None:
            raise self.fail
        self.flushed.append(list(names))
        self.unflushed_since = None


@pytest.fixture
def parts() -> tuple[Clock, Connection, WalFlusher]:
    clock = Clock()
    connection = Connection(clock)
    return clock, connection, WalFlusher(connection, ["c", "d"], idle_s=2.0, max_interval_s=30.0, clock=clock)


def test_nothing_written_nothing_flushed(parts) -> None:  # type: ignore[no-untyped-def]
    clock, connection, flusher = parts
    clock.now += 100
    assert not flusher.flush_if_due() and not flusher.flush_if_due(force=True) and connection.flushed == []


def test_flushes_once_writes_pause(parts) -> None:  # type: ignore[no-untyped-def]
    clock, connection, flusher = parts
    connection.write()
    clock.now += 1.0
    assert not flusher.flush_if_due()  # still writing
    clock.now += 1.5
    assert flusher.flush_if_due() and connection.flushed == [["c", "d"]]
    clock.now += 10
    assert not flusher.flush_if_due()  # nothing new


def test_flushes_during_long_write_streams(parts) -> None:  # type: ignore[no-untyped-def]
    clock, connection, flusher = parts
    for _ in range(29):
        connection.write()
        clock.now += 1.0
        assert not flusher.flush_if_due()
    connection.write()
    clock.now += 1.0
    assert flusher.flush_if_due() and flusher.flushes == 1


def test_store_error_postpones(parts) -> None:  # type: ignore[no-untyped-def]
    clock, connection, flusher = parts
    connection.write()
    clock.now += 5
    connection.fail = errors.UnavailableError("Milvus is unreachable")
    assert not flusher.flush_if_due() and flusher.due()
    connection.fail = None
    assert flusher.flush_if_due() and not flusher.due()


def test_force_flushes_at_shutdown(parts) -> None:  # type: ignore[no-untyped-def]
    _, connection, flusher = parts
    connection.write()
    assert not flusher.flush_if_due() and flusher.flush_if_due(force=True)


def test_auto_means_milvus_lite_only() -> None:
    assert flush_enabled("auto", "milvus_lite-3.2.2")
    assert not flush_enabled("auto", "v2.5.4") and not flush_enabled("auto", "v2.3.5-lite")
    assert flush_enabled("on", "v2.5.4") and not flush_enabled("off", "milvus_lite-3.2.2")
    with pytest.raises(ValueError, match="RAGRPC_MILVUS_FLUSH"):
        flush_enabled("sometimes", "v2.5.4")
