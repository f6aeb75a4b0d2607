"""The writer lease over the in-memory registry: one holder at a time, refused with a message
naming the holder, taken over only once expired (or when its holder's process is gone from this
host), lost when another process took it, released at a clean stop; the lifecycle refuses
writes without it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time

import pytest

from ingest_service.app import build_components
from ingest_service.requests import DocumentSpecInput, IngestItem
from ingest_service.writer_lease import WriterLease, _next_renewal_in, keep_renewed
from ragrpc import errors
from ragrpc.config import Settings
from ragrpc.models import WriterLeaseRecord
from ragrpc.supervised import SupervisedLoop
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def lease(registry: InMemoryDocumentRegistry, clock: Clock, *, host: str = "a", pid: int = 10, **kw) -> WriterLease:  # type: ignore[no-untyped-def]
    return WriterLease(
        registry, ttl_s=30, settle_s=0, clock=clock, host=host, pid=pid, pid_alive=kw.get("alive", lambda p: True)
    )


def test_a_second_process_is_refused_naming_the_holder() -> None:
    registry, clock = InMemoryDocumentRegistry(), Clock()
    first = lease(registry, clock, host="node-1", pid=11)
    first.acquire()
    second = lease(registry, clock, host="node-2", pid=22)
    with pytest.raises(errors.PreconditionError) as refused:
        second.acquire()
    assert refused.value.reason == "WRITER_LEASE_HELD"
    assert first.holder in refused.value.message and "node-1" in refused.value.message
    assert "RAGRPC_WRITER_LEASE_TTL_S" in refused.value.message
    assert errors.status_name(refused.value) == "FAILED_PRECONDITION"


def test_an_expired_lease_is_taken_over_and_the_old_holder_learns_it_lost_it() -> None:
    registry, clock = InMemoryDocumentRegistry(), Clock()
    first = lease(registry, clock, host="node-1", pid=11)
    first.acquire()
    clock.now += 20
    first.renew()  # renewed: still held 29 s later
    clock.now += 29
    with pytest.raises(errors.PreconditionError):
        lease(registry, clock, host="node-2", pid=22).acquire()
    clock.now += 2  # 31 s without renewal: expired
    second = lease(registry, clock, host="node-2", pid=22)
    second.acquire()
    assert second.epoch == first.epoch + 1
    first.renew()
    assert not first.held and "node-2" in first.lost_reason
    with pytest.raises(errors.PreconditionError) as lost:
        first.check()
    assert lost.value.reason == "WRITER_LEASE_LOST"
    second.check()


def test_a_holder_whose_process_is_gone_from_this_host_is_replaced_at_once() -> None:
    registry, clock = InMemoryDocumentRegistry(), Clock()
    lease(registry, clock, host="box", pid=11).acquire()  # then killed: it never released
    restarted = lease(registry, clock, host="box", pid=12, alive=lambda pid: pid != 11)
    restarted.acquire()
    restarted.check()
    # a container restarted under the same host name and pid: its former self cannot be alive
    again = lease(registry, clock, host="box", pid=12)
    again.acquire()
    # but a live process on this host keeps it
    with pytest.raises(errors.PreconditionError):
        lease(registry, clock, host="box", pid=13, alive=lambda pid: True).acquire()


def test_a_released_lease_is_taken_at_once() -> None:
    registry, clock = InMemoryDocumentRegistry(), Clock()
    first = lease(registry, clock, host="node-1", pid=11)
    first.acquire()
    first.release()
    lease(registry, clock, host="node-2", pid=22).acquire()


def test_of_two_takers_at_once_only_the_one_whose_write_stayed_keeps_it() -> None:
    registry, clock = InMemoryDocumentRegistry(), Clock()
    # node-2 had read "no lease" too, and writes its own while node-1 waits to read its write back
    other = WriterLeaseRecord(holder="node-2:22:abc", host="node-2", pid=22, epoch=1, expires_at=clock.now + 30)
    early = WriterLease(
        registry,
        ttl_s=30,
        settle_s=0.01,
        clock=clock,
        host="node-1",
        pid=11,
        sleep=lambda s: registry.write_lease(other),
    )
    with pytest.raises(errors.PreconditionError) as refused:
        early.acquire()
    assert "node-2" in refused.value.message and not early.held


async def test_the_lifecycle_refuses_writes_once_the_lease_is_lost() -> None:
    registry, clock = InMemoryDocumentRegistry(), Clock()
    held = lease(registry, clock, host="node-1", pid=11)
    held.acquire()
    settings = dataclasses.replace(Settings(), workers=2)
    app = build_components(settings, HashingEmbedder(), InMemoryChunkStore(), registry, lease=held)
    spec = DocumentSpecInput(document_id="d1", file_name="d1.txt")
    await app.pipeline.ingest(IngestItem("t1", spec, b"Herons wait by the water."))
    clock.now += 31
    lease(registry, clock, host="node-2", pid=22).acquire()
    held.renew()
    with pytest.raises(errors.PreconditionError) as refused:
        await app.pipeline.ingest(IngestItem("t1", spec, b"Cranes fly over the marsh."))
    assert refused.value.reason == "WRITER_LEASE_LOST"
    with pytest.raises(errors.PreconditionError):
        await app.documents.delete("t1", "d1")
    assert registry.get("t1", "d1").content_hash  # the first version is untouched
    app.shutdown()


class Outage(InMemoryDocumentRegistry):
    """The registry with its lease row's reads and writes failing while `down`."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.lease_writes = 0

    def read_lease(self):  # type: ignore[no-untyped-def]
        if self.down:
            raise errors.UnavailableError("the store is down")
        return super().read_lease()

    def write_lease(self, lease: WriterLeaseRecord) -> None:
        if self.down:
            raise errors.UnavailableError("the store is down")
        self.lease_writes += 1
        super().write_lease(lease)


def test_a_refused_write_asks_for_a_renewal_and_says_retry_in_a_second() -> None:
    registry, clock = InMemoryDocumentRegistry(), Clock()
    held = lease(registry, clock)
    held.acquire()
    clock.now += 21  # within the margin (10 s) of the expiry: writes wait for a renewal
    with pytest.raises(errors.UnavailableError) as refused:
        held.check()
    assert refused.value.retry_after_s == 10.0  # no renewal loop listening: its next turn, ttl/3
    cues: list[int] = []
    held.when_refused(lambda: cues.append(1))
    with pytest.raises(errors.UnavailableError) as refused:
        held.check()
    assert refused.value.reason == "WRITER_LEASE_EXPIRED" and refused.value.retry_after_s == 1.0 and cues == [1]
    held.renew()
    held.check()  # renewed: writes go through, no cue
    assert cues == [1]


async def test_after_an_outage_the_first_refused_write_gets_the_lease_renewed_at_once() -> None:
    registry, clock = Outage(), Clock()
    held = lease(registry, clock)
    held.acquire()
    renewal = SupervisedLoop("writer-lease", held.renew, interval_s=3600, max_backoff_s=3600)  # never on its own
    keeper = asyncio.create_task(keep_renewed(held, renewal, min_gap_s=0.2))
    try:
        registry.down = True
        clock.now += 25  # the store was down past the renewals: writes are refused
        writes_before = registry.lease_writes
        for _ in range(50):  # a burst of refused writes while the store is still down
            with pytest.raises(errors.UnavailableError):
                await asyncio.to_thread(held.check)
        await asyncio.sleep(0.5)
        assert 1 <= renewal.failures <= 4, "cued renewals are spaced (min_gap_s), not one per refused write"
        registry.down = False  # the store is back
        with pytest.raises(errors.UnavailableError) as refused:
            await asyncio.to_thread(held.check)  # the first write after it is refused, and cues a renewal
        assert refused.value.retry_after_s == 1.0
        for _ in range(100):
            if registry.lease_writes > writes_before:
                break
            await asyncio.sleep(0.02)
        await asyncio.to_thread(held.check)  # its retry a second later goes through
        assert registry.lease_writes == writes_before + 1
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
    assert held._on_refused is None  # noqa: SLF001 - the cue is taken back when the loop ends


async def test_the_renewal_loop_ends_when_the_lease_is_lost() -> None:
    registry, clock = InMemoryDocumentRegistry(), Clock()
    held = lease(registry, clock, host="node-1", pid=11)
    held.acquire()
    clock.now += 31
    lease(registry, clock, host="node-2", pid=22).acquire()  # took it over
    renewal = SupervisedLoop("writer-lease", held.renew, interval_s=0.01)
    await asyncio.wait_for(keep_renewed(held, renewal), timeout=5)
    assert "node-2" in held.lost_reason


class FailsOnce(InMemoryDocumentRegistry):
    """The registry whose first lease renewal after `arm()` fails (a store that was away for a moment)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.failed_at: float | None = None

    def arm(self) -> None:
        self.armed = True

    def read_lease(self):  # type: ignore[no-untyped-def]
        if self.armed:
            self.armed = False
            self.failed_at = time.monotonic()
            raise errors.UnavailableError("the store is down")
        return super().read_lease()


async def test_one_failed_renewal_is_retried_before_writes_would_be_refused() -> None:
    """With the interval and the margin both ttl/3, the loop's backoff after one failed renewal puts its next
    try exactly where writes start being refused; the retry comes `lead_s` before that instead, so a store that
    answers again never sees a write refused (CI once saw an upload refused 0.4 s after a successful one)."""
    registry = FailsOnce()
    # settle_s as in service: a late renewal reads its row back half a second later, refusing writes meanwhile
    held = WriterLease(registry, ttl_s=6.0, settle_s=0.5, clock=time.monotonic, host="a", pid=10)
    held.acquire()
    renewal = SupervisedLoop("writer-lease", held.renew, interval_s=2.0, max_backoff_s=2.0)
    registry.arm()  # the loop's first turn (2 s in) fails; its backoff would try again 2 s later, at the margin
    keeper = asyncio.create_task(keep_renewed(held, renewal, lead_s=0.8, min_gap_s=0.2))
    refused: list[float] = []
    started = time.monotonic()
    try:
        while time.monotonic() - started < 6.0:
            try:
                held.check()
            except errors.UnavailableError:
                refused.append(time.monotonic() - started)
            await asyncio.sleep(0.02)
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
    assert registry.failed_at is not None and renewal.failures == 1
    assert renewal.steps >= 2, "renewed after the failure, and again on the loop's own turn"
    assert not refused, f"writes refused at {refused[:3]} s although only one renewal failed"


def test_the_next_renewal_comes_before_the_refusals_whatever_the_backoff() -> None:
    registry, clock = InMemoryDocumentRegistry(), Clock()
    held = lease(registry, clock)  # ttl 30 s: refusals start 20 s after a renewal
    held.acquire()
    renewal = SupervisedLoop("writer-lease", held.renew, interval_s=10, max_backoff_s=10)
    assert _next_renewal_in(held, renewal, lead_s=2, min_gap_s=1) == 10  # the loop's own interval
    renewal.consecutive_failures = 1  # a turn failed at +10 s: the backoff says 10 s more
    clock.now += 10
    assert _next_renewal_in(held, renewal, lead_s=2, min_gap_s=1) == 8  # 2 s before the refusals
    clock.now += 7.5
    assert _next_renewal_in(held, renewal, lead_s=2, min_gap_s=1) == 1  # within the lead: every min_gap
    renewal.consecutive_failures = 0
    assert _next_renewal_in(held, renewal, lead_s=2, min_gap_s=1) == 0.5  # no failure: at the lead
    clock.now += 1
    assert _next_renewal_in(held, renewal, lead_s=2, min_gap_s=1) == 0  # past it: renew now
    clock.now += 5  # refusing: refused writes cue renewals; the loop itself backs off as before
    renewal.consecutive_failures = 3
    assert _next_renewal_in(held, renewal, lead_s=2, min_gap_s=1) == 10
