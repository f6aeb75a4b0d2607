"""Background work that must keep running: a step repeated every interval, supervised.

`SupervisedLoop.run()` calls `step()` off the event loop (in a thread) every `interval_s`.
An exception in a step never ends the loop: it is logged with its traceback, counted
(`failures`, and the `ragrpc_background_failures_total{task}` metric when one is given), and
the next try waits with exponential backoff (interval doubled per consecutive failure, at
most `max_backoff_s`, 5 s unless told); the first success resets it. The cap is short on
purpose: it bounds how long a loop goes on failing after its cause is gone (a store that came
back), and so how long health stays NOT_SERVING after it: at most `max_backoff_s` plus the
health watch's period. The first failure in a row is logged with its traceback, the ones after
it in one line each. Cancellation (service shutdown) ends the
loop at once and is not counted. `consecutive_failures` lets a health check tell a task that
cannot recover from one that had a passing fault.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger(__name__)


class SupervisedLoop:
    def __init__(
        self,
        name: str,
        step: Callable[[], Any],
        *,
        interval_s: float,
        max_backoff_s: float = 5.0,
        on_failure: Callable[[str], None] | None = None,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"{name}: the interval must be > 0 seconds, got {interval_s}")
        self.name = name
        self._step = step
        self._interval = interval_s
        self._max_backoff = max(max_backoff_s, interval_s)
        self._on_failure = on_failure
        self._sleep = sleep
        self.failures = 0
        self.consecutive_failures = 0
        self.steps = 0

    def next_delay(self) -> float:
        if not self.consecutive_failures:
            return self._interval
        return min(self._max_backoff, self._interval * 2**self.consecutive_failures)

    async def run(self) -> None:
        """Until cancelled."""
        while True:
            await self._sleep(self.next_delay())
            await self.run_once()

    async def run_once(self) -> bool:
        """One supervised step; True when it succeeded."""
        try:
            await asyncio.to_thread(self._step)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - supervision: log, count, back off, go on
            self.failures += 1
            self.consecutive_failures += 1
            if self.consecutive_failures == 1:
                logger.exception(
                    "background task %s failed (1 in a row); retrying in %.1fs", self.name, self.next_delay()
                )
            else:
                error = sys.exc_info()[1]
                logger.warning(
                    "background task %s failed (%d in a row): %s: %s; retrying in %.1fs",
                    self.name,
                    self.consecutive_failures,
                    type(error).__name__,
                    error,
                    self.next_delay(),
                )
            if self._on_failure is not None:
                self._on_failure(self.name)
            return False
        self.steps += 1
        if self.consecutive_failures:
            logger.info("background task %s recovered after %d failures", self.name, self.consecutive_failures)
        self.consecutive_failures = 0
        return True


async def watch_health(
    loops: Sequence[SupervisedLoop],
    running: Any,
    *,
    failures_before_not_serving: int = 5,
    period_s: float = 1.0,
    ready: Callable[[], bool] = lambda: True,
) -> None:
    """Health follows the supervised loops (run as a background task of the server): NOT_SERVING
    while one of them failed `failures_before_not_serving` times in a row (it does not recover by
    itself: a load balancer should send calls elsewhere), SERVING again once they all succeed
    again and `ready()` (e.g. the index is loaded, the writer lease is held)."""
    unhealthy = False
    while True:
        await asyncio.sleep(period_s)
        failing = [loop.name for loop in loops if loop.consecutive_failures >= failures_before_not_serving]
        if failing and not unhealthy:
            logger.error("NOT_SERVING: background task(s) %s keep failing", ", ".join(failing))
            await running.set_not_serving()
            unhealthy = True
        elif not failing and unhealthy and ready():
            logger.info("SERVING again: background tasks recovered")
            await running.set_serving()
            unhealthy = False
