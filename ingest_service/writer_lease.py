"""The writer lease: one ingest process writes a collection at a time.

The lease is one row of the jobs collection (`WriterLeaseRecord`: holder id, host, pid, epoch,
expiry in wall-clock seconds). At start an ingest service takes it before recovery, and refuses
to start (FAILED_PRECONDITION, WRITER_LEASE_HELD, naming the holder) while another process
holds it unexpired; recovery of a second process would otherwise roll back the first one's
attempts in flight. It takes over a lease that expired (the holder stopped renewing: killed,
partitioned), or one whose holder ran on this host under a pid that no longer exists, or under
this process's own pid (a crash and restart on one machine, or of one container, need not
wait). Every take-over increments the epoch.

While it runs, the holder renews the lease every ttl/3 (a supervised loop). If a renewal finds
another holder or epoch, the lease was lost (this process stalled past the ttl and another one
took over): from then on `check()` raises and every ingestion attempt of this process is
refused before it writes, and the service reports NOT_SERVING. A clean shutdown releases the
lease (expiry 0) so the next start takes it at once.

Milvus has no compare-and-set: two processes starting within the same moment could both write
the row. After writing, the taker waits `settle_s` and reads the row back; only the one whose
write is there keeps the lease, the other refuses. Wall clocks of the hosts are assumed to agree
to well within the ttl.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable

from ragrpc import errors
from ragrpc.models import WriterLeaseRecord
from ragrpc.store.base import DocumentRegistry

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
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"the writer lease ttl must be > 0 seconds, got {ttl_s}")
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
        """Extends the lease (a supervised step); marks it lost when another process holds it now."""
        if self._held is None or self.lost_reason:
            return
        stored = self._registry.read_lease()
        if stored is None or stored.holder != self.holder or stored.epoch != self._held.epoch:
            holder = stored.holder if stored else "nobody"
            self.lost_reason = f"the writer lease was taken over by {holder}"
            logger.error("%s: this ingest service stops writing", self.lost_reason)
            return
        now = self._clock()
        if now > self._held.expires_at:
            logger.warning("the writer lease was renewed %.1fs after it expired", now - self._held.expires_at)
        self._held.renewed_at = now
        self._held.expires_at = now + self.ttl_s
        self._registry.write_lease(self._held)

    def check(self) -> None:
        """Raises when this process may not write (the lease was lost, or never taken)."""
        if self._held is None:
            raise errors.PreconditionError(
                "this ingest service does not hold the writer lease", reason="NO_WRITER_LEASE"
            )
        if self.lost_reason:
            raise errors.PreconditionError(
                f"{self.lost_reason}; this ingest service no longer writes: restart it once the other one stopped",
                reason="WRITER_LEASE_LOST",
            )

    def release(self) -> None:
        """At a clean shutdown: the next ingest service may take the lease at once."""
        if self._held is None or self.lost_reason:
            return
        stored = self._registry.read_lease()
        if stored is not None and stored.holder == self.holder:
            self._held.expires_at = 0.0
            self._registry.write_lease(self._held)
        self._held = None
