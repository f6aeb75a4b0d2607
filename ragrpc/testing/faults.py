"""Fault injection for the store: wrappers of a DocumentRegistry and a ChunkStore that fail chosen
calls with the failures the Milvus adapters raise, for tests that drive the real pipeline,
lifecycle, recovery, follower and servicer code through every failure of a scenario.

Every call through the wrappers is counted by one `FaultPlan` (a page of a scan or of the
deletion journal counts as a call of its own: a scan can fail after its first pages). A plan
fails the k-th call (`FaultPlan.at`, for a matrix that runs a scenario once for every k and
every failure class) or each call with a probability from a seeded generator
(`FaultPlan.random`, for chaos runs); `clear()` ends the fault, as a store that comes back.

The failure classes (`FaultKind`) are what a store call can do, as the adapters report it:

    UNAVAILABLE_BEFORE  the call never reached the store: nothing applied; UnavailableError
    UNAVAILABLE_AFTER   the store applied the call, the answer was lost; UnavailableError
    TIMEOUT             the call hangs past the client's deadline, the store applies it during the
                        hang, the caller gets pymilvus' DEADLINE_EXCEEDED (UnavailableError)
    REFUSED             the store answered and refused: nothing applied (the adapters' mapping of
                        a refusal)
    TOO_LARGE           the request or its answer was over the message limit: nothing applied

The errors are made by the adapters' own translation (`ragrpc.store.milvus_connection.
translate_exception`) from the exceptions pymilvus raises, so a test sees exactly what the
service sees from a real server. A timed-out write is applied during its hang, before the
error: Milvus orders the calls of one writer (MilvusConnection sends them one at a time), so
a write that timed out was applied before any later one, or never (UNAVAILABLE_BEFORE).

Models: Lucene's MockDirectoryWrapper (seeded random failures of every file call), Milvus'
chaos checkers (success rates of each operation during and after a fault).
"""

from __future__ import annotations

import enum
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from ragrpc import errors
from ragrpc.models import ChunkRecord, DocumentRecord, IngestJobRecord, ScoredChunk, WriterLeaseRecord
from ragrpc.store.filters import FilterExpr

T = TypeVar("T")


class FaultKind(enum.Enum):
    UNAVAILABLE_BEFORE = "unavailable_before"
    UNAVAILABLE_AFTER = "unavailable_after"
    TIMEOUT = "timeout"
    REFUSED = "refused"
    TOO_LARGE = "too_large"


ALL_KINDS = tuple(FaultKind)
# For a read, "applied" changes nothing: failing before or after the store answered is the same.
READ_KINDS = (FaultKind.UNAVAILABLE_BEFORE, FaultKind.TIMEOUT, FaultKind.REFUSED, FaultKind.TOO_LARGE)

WRITE_CALLS = frozenset(
    {
        "chunks.insert_chunks",
        "chunks.upsert_chunks",
        "chunks.delete_chunks",
        "registry.put",
        "registry.delete",
        "registry.purge_deletions",
        "registry.journal_changes",
        "registry.purge_changes",
        "registry.put_job",
        "registry.write_lease",
    }
)


def is_write(call: str) -> bool:
    return call in WRITE_CALLS


def store_error(kind: FaultKind, operation: str) -> errors.RagrpcError:
    """The ragrpc error the Milvus adapters raise for this failure of `operation`, made by their
    translation from the exception pymilvus raises."""
    import grpc
    from pymilvus.exceptions import MilvusException, MilvusUnavailableException

    from ragrpc.store.milvus_connection import translate_exception

    cause: Exception
    if kind in (FaultKind.UNAVAILABLE_BEFORE, FaultKind.UNAVAILABLE_AFTER):
        cause = MilvusUnavailableException(message="server unavailable: connection refused (injected)")
    elif kind is FaultKind.TIMEOUT:
        cause = MilvusException(code=grpc.StatusCode.DEADLINE_EXCEEDED, message="Deadline Exceeded (injected)")
    elif kind is FaultKind.TOO_LARGE:
        cause = MilvusException(
            code=grpc.StatusCode.RESOURCE_EXHAUSTED,
            message="Received message larger than max (300000000 vs. 268435456) (injected)",
        )
    else:
        cause = MilvusException(
            code=1100,
            message="invalid parameter: collection ragrpc_chunks refused the call, expr 'tenant == \"x\"' (injected)",
        )
    return translate_exception(cause, operation)


@dataclass
class InjectedFault:
    """A fault that fired: which call, the how-many-th, and what kind."""

    number: int
    call: str
    kind: FaultKind


@dataclass
class FaultPlan:
    """Which calls fail. Thread-safe: store calls run in executor threads."""

    fail_at: int = 0  # the number of the call to fail (1-based); 0: none by number
    kind: FaultKind = FaultKind.UNAVAILABLE_BEFORE
    only: frozenset[str] | None = None  # count only these calls (e.g. writes); None: every call
    rate: float = 0.0  # random mode: probability that a counted call fails
    kinds: tuple[FaultKind, ...] = ALL_KINDS
    seed: int = 0
    hang_s: float = 0.02  # how long a TIMEOUT blocks its caller
    calls: list[str] = field(default_factory=list)  # every counted call, in order
    fired: list[InjectedFault] = field(default_factory=list)
    _random: random.Random = field(init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _active: bool = field(default=True, init=False, repr=False)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)

    @classmethod
    def counting(cls, only: frozenset[str] | None = None) -> FaultPlan:
        """Fails nothing: counts the calls of a scenario (the k's of its matrix)."""
        return cls(only=only)

    @classmethod
    def at(cls, number: int, kind: FaultKind, only: frozenset[str] | None = None) -> FaultPlan:
        return cls(fail_at=number, kind=kind, only=only)

    @classmethod
    def random(
        cls, seed: int, rate: float, kinds: tuple[FaultKind, ...] = ALL_KINDS, hang_s: float = 0.02
    ) -> FaultPlan:
        return cls(rate=rate, kinds=kinds, seed=seed, hang_s=hang_s)

    def clear(self) -> None:
        """The fault is over: from now on every call passes (and is still counted)."""
        with self._lock:
            self._active = False

    def resume(self) -> None:
        with self._lock:
            self._active = True

    def _decide(self, call: str) -> tuple[int, FaultKind | None]:
        with self._lock:
            if self.only is not None and call not in self.only:
                return 0, None
            self.calls.append(call)
            number = len(self.calls)
            if not self._active:
                return number, None
            if self.fail_at and number == self.fail_at:
                kind: FaultKind | None = self.kind
            elif self.rate > 0 and self._random.random() < self.rate:
                kind = self._random.choice(self.kinds)
            else:
                kind = None
            if kind is not None and not is_write(call) and kind is FaultKind.UNAVAILABLE_AFTER:
                kind = FaultKind.UNAVAILABLE_BEFORE  # a read has nothing to apply
            if kind is not None:
                self.fired.append(InjectedFault(number, call, kind))
            return number, kind

    def run(self, call: str, apply: Callable[[], T]) -> T:
        """Runs one store call through the plan."""
        _, kind = self._decide(call)
        if kind is None:
            return apply()
        operation = call.split(".", 1)[1]
        if kind is FaultKind.UNAVAILABLE_AFTER:
            apply()
        elif kind is FaultKind.TIMEOUT:
            time.sleep(self.hang_s / 2)
            if is_write(call):
                apply()
            time.sleep(self.hang_s / 2)
        raise store_error(kind, operation)

    def pages(self, call: str, make: Callable[[], Iterator[T]]) -> Iterator[T]:
        """A paged read: fetching each page is a call of its own (a scan can fail half-way)."""
        pages = _Pages(make)
        while self.run(call, pages.fetch):
            yield pages.last


class _Pages(Generic[T]):
    """The pages of a paged read, fetched one at a time."""

    def __init__(self, make: Callable[[], Iterator[T]]) -> None:
        self._make = make
        self._iterator: Iterator[T] | None = None
        self.last: T

    def fetch(self) -> bool:
        if self._iterator is None:
            self._iterator = self._make()
        for page in self._iterator:
            self.last = page
            return True
        return False


class FaultyChunkStore:
    """A ChunkStore whose calls go through a FaultPlan. `inner` may be swapped between runs."""

    def __init__(self, inner: Any, plan: FaultPlan) -> None:
        self.inner = inner
        self.plan = plan

    def __getattr__(self, name: str) -> Any:  # properties and extras of the inner store
        return getattr(self.inner, name)

    @property
    def supports_bm25(self) -> bool:
        return bool(self.inner.supports_bm25)

    @property
    def embedded(self) -> bool:
        return bool(self.inner.embedded)

    @property
    def searches_exactly_in_process(self) -> bool:
        return bool(self.inner.searches_exactly_in_process)

    @property
    def upsert_keeps_partitions(self) -> bool:
        return bool(self.inner.upsert_keeps_partitions)

    def insert_chunks(self, chunks: list[ChunkRecord]) -> None:
        self.plan.run("chunks.insert_chunks", lambda: self.inner.insert_chunks(chunks))

    def upsert_chunks(self, chunks: list[ChunkRecord]) -> None:
        self.plan.run("chunks.upsert_chunks", lambda: self.inner.upsert_chunks(chunks))

    def delete_chunks(self, expr: FilterExpr) -> int:
        return int(self.plan.run("chunks.delete_chunks", lambda: self.inner.delete_chunks(expr)))

    def count_chunks(self, expr: FilterExpr) -> int:
        return int(self.plan.run("chunks.count_chunks", lambda: self.inner.count_chunks(expr)))

    def query_chunks(self, expr: FilterExpr, limit: int, with_vectors: bool = False) -> list[ChunkRecord]:
        return self.plan.run("chunks.query_chunks", lambda: self.inner.query_chunks(expr, limit, with_vectors))  # type: ignore[no-any-return]

    def get_chunks(
        self,
        chunk_ids: list[str],
        with_vectors: bool = False,
        with_bm25_terms: bool = False,
        index_fields_only: bool = False,
    ) -> list[ChunkRecord]:
        return self.plan.run(  # type: ignore[no-any-return]
            "chunks.get_chunks",
            lambda: self.inner.get_chunks(chunk_ids, with_vectors, with_bm25_terms, index_fields_only),
        )

    def scan_chunks(
        self,
        expr: FilterExpr,
        batch_size: int | None = None,
        with_vectors: bool = False,
        with_bm25_terms: bool = False,
        index_fields_only: bool = False,
    ) -> Iterator[list[ChunkRecord]]:
        return self.plan.pages(
            "chunks.scan_chunks",
            lambda: self.inner.scan_chunks(expr, batch_size, with_vectors, with_bm25_terms, index_fields_only),
        )

    def search_dense(self, vector: np.ndarray, expr: FilterExpr, limit: int, rows: bool = True) -> list[ScoredChunk]:
        return self.plan.run("chunks.search_dense", lambda: self.inner.search_dense(vector, expr, limit, rows))  # type: ignore[no-any-return]

    def search_bm25(self, query: str, expr: FilterExpr, limit: int) -> list[ScoredChunk]:
        return self.plan.run("chunks.search_bm25", lambda: self.inner.search_bm25(query, expr, limit))  # type: ignore[no-any-return]


class FaultyRegistry:
    """A DocumentRegistry whose calls go through a FaultPlan. `inner` may be swapped between runs."""

    def __init__(self, inner: Any, plan: FaultPlan) -> None:
        self.inner = inner
        self.plan = plan

    def __getattr__(self, name: str) -> Any:  # ensure_model, page_size and other extras
        return getattr(self.inner, name)

    def get(self, tenant: str, document_id: str) -> DocumentRecord | None:
        return self.plan.run("registry.get", lambda: self.inner.get(tenant, document_id))  # type: ignore[no-any-return]

    def get_many(self, keys: list[str]) -> dict[str, DocumentRecord]:
        return self.plan.run("registry.get_many", lambda: self.inner.get_many(keys))  # type: ignore[no-any-return]

    def put(self, record: DocumentRecord) -> None:
        self.plan.run("registry.put", lambda: self.inner.put(record))

    def delete(self, tenant: str, document_id: str) -> None:
        self.plan.run("registry.delete", lambda: self.inner.delete(tenant, document_id))

    def deleted_since(self, updated_after: int) -> Iterator[list[str]]:
        return self.plan.pages("registry.deleted_since", lambda: self.inner.deleted_since(updated_after))

    def purge_deletions(self, older_than: int) -> None:
        self.plan.run("registry.purge_deletions", lambda: self.inner.purge_deletions(older_than))

    def journal_changes(self, keys: list[str]) -> None:
        self.plan.run("registry.journal_changes", lambda: self.inner.journal_changes(keys))

    def changed_since(self, updated_after: int) -> Iterator[list[tuple[str, int]]]:
        return self.plan.pages("registry.changed_since", lambda: self.inner.changed_since(updated_after))

    def purge_changes(self, older_than: int) -> None:
        self.plan.run("registry.purge_changes", lambda: self.inner.purge_changes(older_than))

    def find_by_hash(self, tenant: str, collection: str, content_hash: str) -> list[DocumentRecord]:
        return self.plan.run(  # type: ignore[no-any-return]
            "registry.find_by_hash", lambda: self.inner.find_by_hash(tenant, collection, content_hash)
        )

    def list_keys(self, expr: FilterExpr, *, after: str = "", limit: int) -> list[str]:
        return self.plan.run("registry.list_keys", lambda: self.inner.list_keys(expr, after=after, limit=limit))  # type: ignore[no-any-return]

    def scan_keys(self, expr: FilterExpr) -> Iterator[list[str]]:
        return self.plan.pages("registry.scan_keys", lambda: self.inner.scan_keys(expr))

    def scan(self, expr: FilterExpr) -> Iterator[list[DocumentRecord]]:
        return self.plan.pages("registry.scan", lambda: self.inner.scan(expr))

    def put_job(self, job: IngestJobRecord) -> None:
        self.plan.run("registry.put_job", lambda: self.inner.put_job(job))

    def get_job(self, job_id: str) -> IngestJobRecord | None:
        return self.plan.run("registry.get_job", lambda: self.inner.get_job(job_id))  # type: ignore[no-any-return]

    def read_lease(self) -> WriterLeaseRecord | None:
        return self.plan.run("registry.read_lease", lambda: self.inner.read_lease())  # type: ignore[no-any-return]

    def write_lease(self, lease: WriterLeaseRecord) -> None:
        self.plan.run("registry.write_lease", lambda: self.inner.write_lease(lease))


def fault_matrix(calls: list[str], kinds: tuple[FaultKind, ...] = ALL_KINDS) -> Iterator[tuple[int, str, FaultKind]]:
    """(k, call, kind) for every call of a counted scenario and every failure class that call can
    meet (a read has no 'applied, then unavailable')."""
    for number, call in enumerate(calls, start=1):
        for kind in kinds:
            if kind is FaultKind.UNAVAILABLE_AFTER and not is_write(call):
                continue
            yield number, call, kind
