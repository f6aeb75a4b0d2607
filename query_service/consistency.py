"""Read your writes in the query service: a Retrieve or Ask that passes a consistency token
(ragrpc.consistency) is answered only once the registry follower reflects that write.

The follower reflects a token when it shows every document the token names at the version the
token names (the write itself is applied), or when it has applied a whole poll that began after
the write (so the write, or a newer one, is applied). Until then the call asks for a poll at once
(polls that callers ask for at the same moment are one poll) and checks again after each, for at
most RAGRPC_CONSISTENCY_MAX_WAIT_S and never past shortly before the call's deadline; then it
fails with FAILED_PRECONDITION (CONSISTENCY_LAG) naming the lag - never a stale answer. (Not
UNAVAILABLE: clients retry that by themselves within the same deadline, and the caller would see
DEADLINE_EXCEEDED instead of the lag.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from query_service.registry_follower import RegistryFollower
from ragrpc import deadlines, errors
from ragrpc.consistency import ConsistencyToken

logger = logging.getLogger(__name__)

_DEADLINE_MARGIN_S = 0.25  # the error leaves this long before the caller's deadline
_RECHECK_S = 0.02


class ConsistencyGate:
    def __init__(
        self,
        follower: RegistryFollower,
        *,
        max_wait_s: float = 10.0,
        wall_clock: Callable[[], float] = time.time,
        time_left: Callable[[], float | None] = deadlines.time_left_s,
    ) -> None:
        if max_wait_s < 0:
            raise ValueError(f"RAGRPC_CONSISTENCY_MAX_WAIT_S must be >= 0, got {max_wait_s}")
        self._follower = follower
        self._max_wait = max_wait_s
        self._wall_clock = wall_clock
        self._time_left = time_left
        self._poll: asyncio.Future[None] | None = None
        self.waits = 0  # calls that had to wait (for tests and metrics)

    def reflects(self, token: ConsistencyToken) -> bool:
        follower = self._follower
        if follower.applied_through >= token.written_at:
            return True
        return bool(token.versions) and all(follower.version_of(key) == version for key, version in token.versions)

    async def wait(self, token: ConsistencyToken) -> None:
        """Returns once the follower reflects `token`; PreconditionError when it does not in time."""
        if self.reflects(token):
            return
        self.waits += 1
        left = self._time_left()
        budget = self._max_wait if left is None else min(self._max_wait, left - _DEADLINE_MARGIN_S)
        started = time.monotonic()
        while True:
            await self._polled()
            if self.reflects(token):
                return
            waited = time.monotonic() - started
            if waited >= budget:
                raise self._lag(token, waited)
            await asyncio.sleep(min(_RECHECK_S, max(0.0, budget - waited)))

    async def _polled(self) -> None:
        """One poll of the follower that starts now or later; callers at the same moment share it."""
        if self._poll is None or self._poll.done():
            self._poll = asyncio.ensure_future(asyncio.to_thread(self._poll_once))
        await asyncio.shield(self._poll)

    def _poll_once(self) -> None:
        try:
            self._follower.poll()
        except Exception as exc:  # noqa: BLE001 - the follower's own loop logs and counts its failures
            logger.info("a poll asked for by a consistency token failed: %s", exc)

    def _lag(self, token: ConsistencyToken, waited: float) -> errors.PreconditionError:
        behind = [key for key, version in token.versions if self._follower.version_of(key) != version]
        lag = max(0.0, self._wall_clock() - max(self._follower.applied_through, 0.0))
        named = f"; documents not yet shown as written: {', '.join(behind[:5])}" if behind else ""
        return errors.PreconditionError(
            f"the query service has not yet caught up with the write of the consistency token after waiting "
            f"{waited:.1f}s (it reflects the registry as of {lag:.1f}s ago; {self._follower.lagging} change(s) "
            f"not applied yet{named}); retry shortly, or leave consistency_token empty to read what it shows now",
            reason="CONSISTENCY_LAG",
            metadata={"waited_s": f"{waited:.3f}", "lag_s": f"{lag:.3f}", "documents_behind": str(len(behind))},
        )
