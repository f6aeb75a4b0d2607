"""The writer lease: one ingest process writes a collection at a time.

The lease is one row of the jobs collection (`WriterLeaseRecord`: holder id, host, pid, epoch,
expiry in wall-clock seconds). At start an ingest service takes it before recovery, and refuses
to start (FAILED_PRECONDITION, WRITER_LEASE_HELD, naming the holder) while another process
holds it unexpired; recovery of a second process would otherwise roll back the first one's
attempts in flight. It takes over a lease that expired (the holder stopped renewing: killed,
partitioned), or one whose holder ran on this host under a pid that no longer exists, or under
this process's own pid (a crash and restart on one machine, or of one container, need not
wait). Every take-over increments the epoch.

While it runs, the holder renews the lease every ttl/3 (a supervised loop; after a failed renewal, at
the latest shortly before writes would be refused). If a renewal finds
another holder or epoch, the lease was lost (this process stalled past the ttl and another one
took over): from then on `check()` raises and the service reports NOT_SERVING. A clean shutdown
releases the lease (expiry 0) so the next start takes it at once.

Fencing: every write call to the store (chunks and registry) goes through `FencedChunkStore` /
`FencedRegistry`, which call `check()` first, not only the lifecycle's transitions. `check()`
honours expiry by this process's clock: once fewer than `margin_s` seconds (ttl/3 by default)
are left before the held lease expires, writes are refused (UNAVAILABLE, WRITER_LEASE_EXPIRED)
until a renewal extends it. A refused write asks for that renewal at once (`keep_renewed`), so a
service whose store came back after an outage writes again within a second or so, not at the
renewal loop's next turn (up to ttl/3 later). A holder that was paused or cut off from the store therefore stops
writing before another process may take the lease over (which needs the lease expired by its
own clock), and never overwrites what the next holder's recovery and writes put in place; the
margin covers the time a write takes to reach the store and the clocks' disagreement.

Milvus has no compare-and-set: two processes starting within the same moment could both write
the row. After writing, the taker waits `settle_s` and reads the row back; only the one whose
write is there keeps the lease, the other refuses. Wall clocks of the hosts are assumed to agree
to well within the ttl.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from ragrpc import errors
from ragrpc.models import ChunkRecord, DocumentRecord, IngestJobRecord, WriterLeaseRecord
from ragrpc.store.base import ChunkStore, DocumentRegistry
from ragrpc.store.filters import FilterExpr
from ragrpc.supervised import SupervisedLoop

logger = logging.getLogger(__name__)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WriterLease:
    def __init__(
        self,
        registry: DocumentRegistry,
        *,
        ttl_s: float = 30.0,
        settle_s: float = 0.5,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        host: str | None = None,
        pid: int | None = None,
        pid_alive: Callable[[int], bool] = _pid_alive,
        margin_s: float | None = None,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"the writer lease ttl must be > 0 seconds, got {ttl_s}")
        self.margin_s = ttl_s / 3 if margin_s is None else margin_s
        if not 0 <= self.margin_s < ttl_s:
            raise ValueError(f"the writer lease margin must be >= 0 and below the ttl, got {self.margin_s}")
        self._registry = registry
        self.ttl_s = ttl_s
        self._settle_s = settle_s
        self._clock = clock
        self._sleep = sleep
        self._host = host if host is not None else socket.gethostname()
        self._pid = pid if pid is not None else os.getpid()
        self._pid_alive = pid_alive
        self.holder = f"{self._host}:{self._pid}:{uuid.uuid4().hex[:8]}"
        self._held: WriterLeaseRecord | None = None
        self.lost_reason = ""
        self._on_refused: Callable[[], None] | None = None  # a write was refused for want of a renewal

    @property
    def held(self) -> bool:
        return self._held is not None and not self.lost_reason

    @property
    def epoch(self) -> int:
        return self._held.epoch if self._held else 0

    def acquire(self) -> None:
        """Takes the lease, or raises PreconditionError naming the process that holds it."""
        current = self._registry.read_lease()
        now = self._clock()
        if current is not None and current.holder != self.holder and not self._may_take(current, now):
            raise self._held_by(current, now)
        lease = WriterLeaseRecord(
            holder=self.holder,
            host=self._host,
            pid=self._pid,
            epoch=(current.epoch if current else 0) + 1,
            acquired_at=now,
            renewed_at=now,
            expires_at=now + self.ttl_s,
        )
        self._registry.write_lease(lease)
        if self._settle_s > 0:
            self._sleep(self._settle_s)
        stored = self._registry.read_lease()
        if stored is not None and stored.holder != self.holder:  # another process wrote it meanwhile
            raise self._held_by(stored, self._clock())
        if stored is None:
            raise errors.UnavailableError("the writer lease could not be read back after it was written; retry")
        self._held = lease
        self.lost_reason = ""
        if current is not None and current.expires_at > 0:
            logger.warning(
                "took over the writer lease from %s (epoch %d -> %d)", current.holder, current.epoch, lease.epoch
            )
        logger.info("writer lease held by %s (epoch %d, ttl %.0fs)", self.holder, lease.epoch, self.ttl_s)

    def _may_take(self, current: WriterLeaseRecord, now: float) -> bool:
        if current.expires_at <= now:
            return True  # expired or released
        # The holder ran on this host and its process is gone (a crash, then a restart here), or it had
        # this very pid (a restarted container: the same host name, pid 1 again) and so cannot be alive.
        if current.host != self._host:
            return False
        return current.pid == self._pid or not self._pid_alive(current.pid)

    def _held_by(self, current: WriterLeaseRecord, now: float) -> errors.PreconditionError:
        return errors.PreconditionError(
            f"another ingest service writes this collection: {current.holder} (host {current.host}, pid "
            f"{current.pid}) holds the writer lease, renewed {max(0.0, now - current.renewed_at):.0f}s ago, "
            f"expiring in {max(0.0, current.expires_at - now):.0f}s; stop it, or start this one after the "
            "lease has expired (RAGRPC_WRITER_LEASE_TTL_S)",
            reason="WRITER_LEASE_HELD",
            metadata={"holder": current.holder, "host": current.host, "pid": str(current.pid)},
        )

    def renew(self) -> None:
        """Extends the lease (a supervised step); marks it lost when another process holds it now.
        The new expiry counts only once it is stored (a failed write leaves the old one). A renewal
        that comes late (within the margin of expiry, when another process may be taking the lease
        over) reads the row back after `settle_s`, as `acquire` does, and keeps the lease only if
        its own write is there."""
        held = self._held
        if held is None or self.lost_reason:
            return
        stored = self._registry.read_lease()
        if stored is None or stored.holder != self.holder or stored.epoch != held.epoch:
            self._lose(stored)
            return
        now = self._clock()
        late = held.expires_at - now <= self.margin_s
        if now > held.expires_at:
            logger.warning("the writer lease is renewed %.1fs after it expired", now - held.expires_at)
        renewed = dataclasses.replace(held, renewed_at=now, expires_at=now + self.ttl_s)
        self._registry.write_lease(renewed)
        if late and self._settle_s > 0:
            self._sleep(self._settle_s)
            back = self._registry.read_lease()
            if back is None or back.holder != self.holder or back.epoch != held.epoch:
                self._lose(back)
                return
        self._held = renewed

    def _lose(self, stored: WriterLeaseRecord | None) -> None:
        holder = stored.holder if stored else "nobody"
        self.lost_reason = f"the writer lease was taken over by {holder}"
        logger.error("%s: this ingest service stops writing", self.lost_reason)

    def check(self) -> None:
        """Raises when this process may not write now: the lease was lost or never taken
        (FAILED_PRECONDITION), or it expires within the margin and was not renewed in time
        (UNAVAILABLE: writes resume once a renewal succeeds)."""
        held = self._held
        if held is None:
            raise errors.PreconditionError(
                "this ingest service does not hold the writer lease", reason="NO_WRITER_LEASE"
            )
        if self.lost_reason:
            raise errors.PreconditionError(
                f"{self.lost_reason}; this ingest service no longer writes: restart it once the other one stopped",
                reason="WRITER_LEASE_LOST",
            )
        left = held.expires_at - self._clock()
        if left <= self.margin_s:
            wanted = self._on_refused
            if wanted is not None:
                wanted()  # renew now: the write's retry (RetryInfo) finds the lease renewed if the store answers
            raise errors.UnavailableError(
                f"the writer lease was last renewed {max(0.0, self._clock() - held.renewed_at):.0f}s ago and "
                f"{'expired' if left <= 0 else 'is about to expire'}; writes wait for its renewal (is the store "
                "reachable?); retry shortly",
                retry_after_s=1.0 if wanted is not None else max(1.0, self.ttl_s / 3),
                reason="WRITER_LEASE_EXPIRED",
            )

    def seconds_until_refusing(self) -> float | None:
        """Seconds (by this lease's clock) until `check()` starts refusing writes for want of a renewal;
        0 or less once it does; None when no lease is held or it was lost."""
        held = self._held
        if held is None or self.lost_reason:
            return None
        return held.expires_at - self.margin_s - self._clock()

    def when_refused(self, callback: Callable[[], None] | None) -> None:
        """`callback` (any thread, must not block) is called when `check()` refuses a write because the
        lease is not renewed: the renewal loop's cue to renew at once (None: no cue)."""
        self._on_refused = callback

    def release(self) -> None:
        """At a clean shutdown: the next ingest service may take the lease at once."""
        if self._held is None or self.lost_reason:
            return
        stored = self._registry.read_lease()
        if stored is not None and stored.holder == self.holder:
            self._held.expires_at = 0.0
            self._registry.write_lease(self._held)
        self._held = None


async def keep_renewed(
    lease: WriterLease,
    renewal: SupervisedLoop,
    *,
    min_gap_s: float = 1.0,
    lead_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Renews the lease with `renewal` (a SupervisedLoop of `lease.renew`) every interval, backing off
    after failures, and at once when a write was refused for want of a renewal (at most one renewal
    in `min_gap_s`: writes refused while the store is still down do not turn into a stream of store
    calls). Returns when the lease is lost.

    A renewal that failed (the store was down or slow for a moment) is retried no later than `lead_s`
    before writes would be refused, then every `min_gap_s` until that point, whatever the loop's
    backoff says: with the interval and the margin both ttl/3, the backoff's next try after one
    failure would fall exactly where writes start being refused, and every write in the renewal's
    round trip (and its read-back) would be refused although the store answers."""
    loop = asyncio.get_running_loop()
    wanted = asyncio.Event()

    def cue() -> None:  # from a store thread
        try:
            loop.call_soon_threadsafe(wanted.set)
        except RuntimeError:  # the loop is closed: the service is stopping
            pass

    lease.when_refused(cue)
    try:
        last = float("-inf")
        while not lease.lost_reason:
            try:
                async with asyncio.timeout(_next_renewal_in(lease, renewal, lead_s, min_gap_s)):
                    await wanted.wait()
                await asyncio.sleep(max(0.0, last + min_gap_s - clock()))  # a cue: at most one renewal a gap
            except TimeoutError:
                pass  # the loop's own turn
            wanted.clear()
            await renewal.run_once()
            last = clock()
    finally:
        lease.when_refused(None)


def _next_renewal_in(lease: WriterLease, renewal: SupervisedLoop, lead_s: float, min_gap_s: float) -> float:
    delay = renewal.next_delay()
    before = lease.seconds_until_refusing()
    if before is not None and before > 0:
        delay = min(delay, max(before - lead_s, min_gap_s if renewal.consecutive_failures else 0.0))
    return delay


class FencedChunkStore:
    """The chunk store with every write checked against the writer lease first (see the module
    docstring); reads pass through."""

    def __init__(self, inner: ChunkStore, lease: WriterLease) -> None:
        self._inner = inner
        self._lease = lease

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def insert_chunks(self, chunks: list[ChunkRecord]) -> None:
        self._lease.check()
        self._inner.insert_chunks(chunks)

    def upsert_chunks(self, chunks: list[ChunkRecord]) -> None:
        self._lease.check()
        self._inner.upsert_chunks(chunks)

    def delete_chunks(self, expr: FilterExpr) -> int:
        self._lease.check()
        return self._inner.delete_chunks(expr)


class FencedRegistry:
    """The registry with every document and job write checked against the writer lease first; the
    lease's own row (read_lease / write_lease) is not fenced."""

    def __init__(self, inner: DocumentRegistry, lease: WriterLease) -> None:
        self._inner = inner
        self._lease = lease

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def put(self, record: DocumentRecord) -> None:
        self._lease.check()
        self._inner.put(record)

    def delete(self, tenant: str, document_id: str) -> None:
        self._lease.check()
        self._inner.delete(tenant, document_id)

    def purge_deletions(self, older_than: int) -> None:
        self._lease.check()
        self._inner.purge_deletions(older_than)

    def journal_changes(self, keys: list[str]) -> None:
        self._lease.check()
        self._inner.journal_changes(keys)

    def purge_changes(self, older_than: int) -> None:
        self._lease.check()
        self._inner.purge_changes(older_than)

    def put_job(self, job: IngestJobRecord) -> None:
        self._lease.check()
        self._inner.put_job(job)
