"""Background tasks are supervised: an unexpected error is logged, counted and retried with
backoff; a success resets the backoff; cancellation ends the loop. The WAL flusher runs this way."""

from __future__ import annotations

import asyncio
import logging

import pytest

from ragrpc.metrics import Metrics
from ragrpc.store.wal_flusher import WalFlusher, supervised_flusher
from ragrpc.supervised import SupervisedLoop


class FlakyStep:
    def __init__(self, failures: int) -> None:
        self.failures_left = failures
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        if self.failures_left:
            self.failures_left -= 1
            raise KeyError("injected fault")


async def test_failures_are_logged_counted_backed_off_and_recovered(caplog: pytest.LogCaptureFixture) -> None:
    slept: list[float] = []
    failed: list[str] = []
    step = FlakyStep(failures=3)

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) > 5:
            raise asyncio.CancelledError

    loop = SupervisedLoop("follow", step, interval_s=0.5, max_backoff_s=3.0, on_failure=failed.append, sleep=sleep)
    with caplog.at_level(logging.ERROR), pytest.raises(asyncio.CancelledError):
        await loop.run()
    assert step.calls == 5 and loop.failures == 3 and loop.consecutive_failures == 0
    assert slept == [0.5, 1.0, 2.0, 3.0, 0.5, 0.5]  # doubled per failure, capped, reset by the success
    assert failed == ["follow"] * 3
    assert "background task follow failed (1 in a row)" in caplog.text and "KeyError" in caplog.text


async def test_a_long_outage_logs_one_traceback_then_one_line_per_failure(caplog: pytest.LogCaptureFixture) -> None:
    loop = SupervisedLoop("flush", FlakyStep(failures=4), interval_s=0.5)
    with caplog.at_level(logging.WARNING):
        assert [await loop.run_once() for _ in range(5)] == [False, False, False, False, True]
    failures = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.levelno for r in failures] == [logging.ERROR] + [logging.WARNING] * 3
    assert failures[0].exc_info is not None and all(r.exc_info is None for r in failures[1:])
    assert "failed (4 in a row): KeyError: 'injected fault'; retrying in 5.0s" in failures[-1].getMessage()


def test_the_default_backoff_cap_keeps_recovery_within_seconds() -> None:
    loop = SupervisedLoop("flush", lambda: None, interval_s=0.5)
    loop.consecutive_failures = 20
    assert loop.next_delay() == 5.0


async def test_cancellation_is_not_a_failure() -> None:
    started = asyncio.Event()

    def slow() -> None:
        started.set()

    loop = SupervisedLoop("quiet", slow, interval_s=0.01)
    task = asyncio.create_task(loop.run())
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert loop.failures == 0


def test_a_non_positive_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval"):
        SupervisedLoop("x", lambda: None, interval_s=0)


class BrokenConnection:
    """A store connection whose flush fails with an error that is not a RagrpcError."""

    unflushed_since: float | None = 0.0
    last_write_at = 0.0

    def __init__(self) -> None:
        self.flushes = 0
        self.fail = 2

    def flush(self, names: list[str]) -> None:
        if self.fail:
            self.fail -= 1
            raise RuntimeError("injected: the client library broke")
        self.flushes += 1
        self.unflushed_since = None


async def test_the_flusher_is_restarted_after_an_unexpected_error() -> None:
    connection = BrokenConnection()
    metrics = Metrics()
    loop = supervised_flusher(WalFlusher(connection, ["c"], idle_s=0.0), metrics, tick_s=0.01)
    assert [await loop.run_once() for _ in range(3)] == [False, False, True]
    assert connection.flushes == 1 and loop.failures == 2
    assert b'ragrpc_background_failures_total{task="wal-flush"} 2.0' in metrics.exposition()


class HealthLog:
    """Records what the watch sets (the RunningServer's set_serving / set_not_serving)."""

    def __init__(self) -> None:
        self.states: list[str] = []

    async def set_serving(self) -> None:
        self.states.append("SERVING")

    async def set_not_serving(self) -> None:
        self.states.append("NOT_SERVING")


async def test_health_turns_not_serving_while_a_task_keeps_failing_and_back_when_it_recovers() -> None:
    from ragrpc.supervised import watch_health

    broken = {"on": True}

    def step() -> None:
        if broken["on"]:
            raise RuntimeError("disk full")

    loop = SupervisedLoop("flaky", step, interval_s=0.001, max_backoff_s=0.002)
    health = HealthLog()
    ready = {"value": True}
    watch = asyncio.create_task(
        watch_health([loop], health, failures_before_not_serving=3, period_s=0.005, ready=lambda: ready["value"])
    )
    runner = asyncio.create_task(loop.run())
    try:
        for _ in range(400):
            if health.states:
                break
            await asyncio.sleep(0.005)
        assert health.states == ["NOT_SERVING"] and loop.consecutive_failures >= 3
        ready["value"] = False  # recovered, but not ready (e.g. the writer lease is lost): stays NOT_SERVING
        broken["on"] = False
        await asyncio.sleep(0.1)
        assert health.states == ["NOT_SERVING"]
        ready["value"] = True
        for _ in range(400):
            if len(health.states) > 1:
                break
            await asyncio.sleep(0.005)
        assert health.states == ["NOT_SERVING", "SERVING"]
    finally:
        watch.cancel()
        runner.cancel()
        await asyncio.gather(watch, runner, return_exceptions=True)
