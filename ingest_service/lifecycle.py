"""The lifecycle of a document: the one owner of its lock and of every write of its lifecycle fields
(`state`, `generation`, `pending_generation`, `stale_generation`, `deleting`). The pipeline, the
document service and start-up recovery call it; nothing else writes those fields (its store-only
steps of settling a failed attempt and of recovery at start are in ingest_service.recovery, called
from here only).

States and transitions (A, G: generations; the chunks queries show are those of `generation`):

    (none)               --begin-->   PROCESSING, pending=G              first ingestion
    FAILED               --begin-->   PROCESSING, pending=G              ingested again
    ACTIVE gen=A         --begin-->   ACTIVE gen=A, pending=G            replacement: A stays visible
    ... pending=G        --commit-->  ACTIVE gen=G, stale=A  -->  ACTIVE gen=G   (switch, then A's chunks go
                                      after the grace period, RAGRPC_REPLACED_VERSION_GRACE_S: query
                                      services that have not applied the switch yet still read them)
    PROCESSING pending=G --fail-->    FAILED (G's chunks go)
    ACTIVE pending=G     --fail-->    ACTIVE gen=A (G's chunks go)
    ACTIVE               --update-->  ACTIVE (chunk fields rewritten in place, or copied to a fresh
                                      generation G on servers whose upsert breaks partition routing:
                                      pending=G, switch, stale=A, A's chunks go)
    any                  --delete-->  deleting  -->  (none)              (chunks go, then the row)
    at start, recover:   deleting -> (none); pending -> rolled back; stale -> removed;
                         PENDING/PROCESSING -> ACTIVE when a generation is visible, else FAILED (ABORTED)

Concurrency (one writer process, made sure of by ingest_service.writer_lease: with the lease lost,
`may_write` raises and no transition starts):
- One lock per document. An attempt holds it from `begin` to `commit` or `fail`; `update` and
  `delete` hold it while they write.
- A delete wins over ingestion: it cancels the document's attempts (running, or waiting for the
  lock or a document slot), their rollback finishes under the lock, then the delete runs. The
  deleted document does not come back; the cancelled attempts end with ABORTED.
- An update while an attempt of the document runs or waits is refused with ABORTED
  (DOCUMENT_BUSY), nothing changed; an update with a stale etag with ABORTED (ETAG_MISMATCH).
- The store writes of an attempt go through `Attempt.call` (ingest_service.attempts): when the attempt is cancelled or
  times out, its rollback first waits for the writes still running in store threads, so no chunk
  lands after the rollback deleted the attempt's chunks.
- A failed attempt whose bookkeeping the store refused (Milvus unreachable) is settled in the
  background, under the document's lock, as soon as the store answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Executor
from typing import Any, TypeVar

from ingest_service.attempts import Attempt, document_etag, finish_despite_cancel
from ingest_service.chunk_records import new_generation
from ingest_service.recovery import recover_documents, settle_failed_attempt
from ragrpc import errors
from ragrpc.models import ChunkRecord, DocumentRecord, DocumentState, chunk_id_for, document_key
from ragrpc.store.base import ChunkStore, DocumentRegistry
from ragrpc.store.filters import chunks_of_document, chunks_of_generation

logger = logging.getLogger(__name__)

T = TypeVar("T")


class DocumentLifecycle:
    """Owns the per-document locks and every transition of a document's lifecycle."""

    def __init__(
        self,
        registry: DocumentRegistry,
        chunks: ChunkStore,
        store_executor: Executor,
        *,
        settle_delays_s: Sequence[float] = (0.5, 1.0, 2.0, 5.0, 10.0),
        may_write: Callable[[], None] = lambda: None,
        replaced_grace_s: float = 0.0,
    ) -> None:
        if replaced_grace_s < 0:
            raise ValueError(f"the grace period of replaced chunks must be >= 0 seconds, got {replaced_grace_s}")
        self._replaced_grace_s = replaced_grace_s
        self._may_write = may_write  # raises when this process may not write (the writer lease was lost)
        self._registry = registry
        self._chunks = chunks
        self._executor = store_executor
        self._locks: dict[str, asyncio.Lock] = {}
        self._attempts: dict[str, set[asyncio.Task[Any]]] = {}
        self._deleted: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
        self._settling: set[asyncio.Task[None]] = set()
        self._settle_delays = settle_delays_s

    async def _store(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # ---- locks and attempts in flight -------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _lock(self, key: str) -> AsyncIterator[None]:
        lock = self._locks.setdefault(key, asyncio.Lock())
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and not lock._waiters:  # type: ignore[attr-defined]
                self._locks.pop(key, None)

    @contextlib.contextmanager
    def registered(self, tenant: str, document_id: str) -> Any:
        """Marks the current task as an ingestion of the document (before it waits for a slot or
        the lock), so that a delete can cancel it."""
        key = document_key(tenant, document_id)
        task = asyncio.current_task()
        assert task is not None
        tasks = self._attempts.setdefault(key, set())
        tasks.add(task)
        try:
            yield
        finally:
            tasks.discard(task)
            if not tasks:
                self._attempts.pop(key, None)

    @contextlib.asynccontextmanager
    async def attempt_lock(self, tenant: str, document_id: str) -> AsyncIterator[None]:
        """The document's lock, for an ingestion of it (registered, so a delete cancels it)."""
        with self.registered(tenant, document_id):
            async with self._lock(document_key(tenant, document_id)):
                yield

    def deleted_during(self, task: asyncio.Task[Any] | None) -> bool:
        """Whether `task` was cancelled by a delete of the document it ingests."""
        return task is not None and task in self._deleted

    def busy(self, tenant: str, document_id: str) -> bool:
        key = document_key(tenant, document_id)
        lock = self._locks.get(key)
        return bool(self._attempts.get(key)) or (lock is not None and lock.locked())

    # ---- an ingestion attempt ---------------------------------------------------------------------

    async def current(self, tenant: str, document_id: str) -> DocumentRecord | None:
        """The stored record, under the attempt's lock, with leftovers of an earlier attempt whose
        bookkeeping the store refused removed first (before a new attempt overwrites the markers). A
        record marked for deletion is a delete to finish first (or one already finished that the store
        still shows: a Milvus 2.3 server's Session read does not see a delete yet); the attempt then
        starts as a first ingestion."""
        existing = await self._store(self._registry.get, tenant, document_id)
        if existing is not None and existing.deleting:
            await finish_despite_cancel(self._store(self._delete, existing))
            return None
        if existing is not None and (existing.pending_generation or existing.stale_generation):
            await finish_despite_cancel(self._store(self._drop_leftovers, existing))
        return existing

    def _drop_leftovers(self, record: DocumentRecord) -> None:
        for leftover in (record.pending_generation, record.stale_generation):
            if leftover:
                self._chunks.delete_chunks(chunks_of_generation(record.tenant, record.document_id, leftover))
        record.pending_generation = record.stale_generation = ""
        if record.state == DocumentState.ACTIVE:
            self._registry.put(record)

    def new_attempt(
        self,
        tenant: str,
        document_id: str,
        *,
        collection: str,
        content_hash: str,
        existing: DocumentRecord | None,
    ) -> Attempt:
        """A new attempt (not stored yet: `begin` records it); a replacement keeps the old version
        visible and ACTIVE until the switch."""
        generation = new_generation()
        if existing is not None:
            record = DocumentRecord(**{**existing.__dict__})
        else:
            record = DocumentRecord(tenant=tenant, document_id=document_id, created_at=int(time.time()))
        record.collection = collection
        record.pending_generation = generation
        replacing = existing is not None and existing.state == DocumentState.ACTIVE
        record.state = DocumentState.ACTIVE if replacing else DocumentState.PROCESSING
        if not replacing:
            record.content_hash = content_hash
        return Attempt(record, existing, generation, self._executor)

    async def begin(self, attempt: Attempt) -> None:
        """Records the attempt (pending_generation) before any of its chunks is written."""
        self._may_write()
        await attempt.call(self._registry.put, attempt.record)

    async def commit(self, attempt: Attempt, chunk_count: int, chunk_span: int = 0) -> DocumentRecord:
        """The switch: the attempt's chunks become the visible version; the replaced one's go."""
        self._may_write()
        record = attempt.record
        old_generation = attempt.existing.generation if attempt.existing else ""
        record.generation = attempt.generation
        record.pending_generation = ""
        record.stale_generation = old_generation
        record.state = DocumentState.ACTIVE
        record.error = record.error_code = ""
        record.chunk_count = chunk_count
        record.chunk_span = chunk_span
        await attempt.call(self._registry.put, record)
        if old_generation and self._replaced_grace_s == 0:
            try:
                await attempt.call(self._settle, record, "", None)
                record.stale_generation = ""
            except errors.RagrpcError as exc:  # the new version is in place; the old rows go once the store answers
                logger.warning("could not remove the replaced chunks of %s yet: %s", record.document_id, exc)
                self._settle_later(record.tenant, record.document_id, functools.partial(self._settle, record, "", None))
        elif old_generation:
            self._remove_replaced_later(record)
        return record

    def _remove_replaced_later(self, record: DocumentRecord) -> None:
        """The replaced version's chunks go once `replaced_grace_s` has passed: a query service that
        has not applied the switch yet still reads them (a query finds the old or the new version,
        never neither). Until then the record names them (`stale_generation`), so recovery removes
        them if the process stops first."""
        self._settle_later(
            record.tenant,
            record.document_id,
            functools.partial(self._settle, record, "", None),
            first_delay_s=self._replaced_grace_s,
        )

    async def fail(self, attempt: Attempt, error: errors.RagrpcError) -> None:
        """Rolls the attempt back (after its running writes have finished): its chunks go, the record
        is FAILED with `error`, or stays ACTIVE with the previous version. Runs to its end even when
        the caller is cancelled meanwhile."""

        async def roll_back() -> None:
            await attempt.quiesce()
            try:
                await self._store(self._settle, attempt.record, attempt.generation, error)
            except errors.RagrpcError as exc:
                logger.warning(
                    "could not record the failure of %s (%s); retrying until the store is back",
                    attempt.record.document_id,
                    exc,
                )
                self._settle_later(
                    attempt.record.tenant,
                    attempt.record.document_id,
                    functools.partial(self._settle, attempt.record, attempt.generation, error),
                )

        await finish_despite_cancel(roll_back())

    # ---- resources --------------------------------------------------------------------------------

    async def update(
        self,
        tenant: str,
        document_id: str,
        *,
        fields: list[str],
        etag: str = "",
        title: str = "",
        tags: list[str] | None = None,
        metadata: dict[str, str] | None = None,
    ) -> DocumentRecord:
        """Changes title/tags/metadata in the registry and on the stored chunks (vectors kept)."""
        self._may_write()
        if self.busy(tenant, document_id):
            raise errors.AbortedError(
                f"document {document_id!r} is being ingested; update it once GetDocument shows it ACTIVE",
                reason="DOCUMENT_BUSY",
                metadata={"document_id": document_id},
            )
        async with self._lock(document_key(tenant, document_id)):
            record = await self._store(self._registry.get, tenant, document_id)
            if record is None or record.deleting:
                raise errors.NotFoundError(
                    f"document {document_id!r} does not exist", metadata={"document_id": document_id}
                )
            current = document_etag(record)
            if etag and etag != current:
                raise errors.AbortedError(
                    f"document {document_id!r} changed since the etag was read; read it again and retry",
                    reason="ETAG_MISMATCH",
                    metadata={"document_id": document_id, "etag": current},
                )
            if record.state != DocumentState.ACTIVE or record.pending_generation:
                raise errors.PreconditionError(
                    f"document {document_id!r} is not ACTIVE (it is being ingested or failed)"
                )
            if record.stale_generation:  # a replaced version in its grace period goes now: a copy would
                await finish_despite_cancel(self._store(self._drop_leftovers, record))  # take over its marker
            changed = DocumentRecord(**{**record.__dict__})
            if "title" in fields:
                changed.title = title
            if "tags" in fields:
                changed.tags = list(tags or [])
            if "metadata" in fields:
                changed.metadata = dict(metadata or {})
                self._chunks.metadata_fields.check_values(changed.metadata)  # declared keys fit their fields
            return await self._rewrite_or_repair(record, changed)

    async def retag_held(self, record: DocumentRecord, tags: list[str]) -> DocumentRecord:
        """Gives an ACTIVE document new tags, in the registry and on its chunks (vectors kept), for an
        ingestion of unchanged content that holds the document's lock (`attempt_lock`)."""
        self._may_write()
        changed = DocumentRecord(**{**record.__dict__})
        changed.tags = list(tags)
        return await self._rewrite_or_repair(record, changed)

    async def _rewrite_or_repair(self, before: DocumentRecord, after: DocumentRecord) -> DocumentRecord:
        """Rewrites the document's chunk fields and record as `after`. When a store call fails, the
        caller gets the error and the document is put right in the background as soon as the store
        answers: its chunks carry the fields its stored record names again (the old ones, or the new
        ones where the record's write was applied), and a copy under a fresh generation that did not
        switch is rolled back. A retry of the update then applies it from a consistent state."""
        try:
            await finish_despite_cancel(self._store(self._rewrite, before, after))
        except errors.RagrpcError as exc:
            logger.warning("the update of %s failed (%s); repairing it in the background", after.document_id, exc)
            self._settle_later(after.tenant, after.document_id, lambda: self._repair_fields(after))
            raise
        if after.stale_generation and self._replaced_grace_s == 0:
            await finish_despite_cancel(self._store(self._settle, after, "", None))
            after.stale_generation = ""
        elif after.stale_generation:
            self._remove_replaced_later(after)
        return after

    def _rewrite(self, before: DocumentRecord, after: DocumentRecord) -> None:
        expr = chunks_of_generation(before.tenant, before.document_id, before.generation)
        chunks = [chunk for page in self._chunks.scan_chunks(expr, with_vectors=True) for chunk in page]
        for chunk in chunks:
            chunk.title = after.title
            chunk.tags = tuple(after.tags)
            chunk.metadata = dict(after.metadata)
        if chunks and self._chunks.upsert_keeps_partitions:
            self._chunks.upsert_chunks(chunks)
            self._registry.put(after)
        elif chunks:
            self._rewrite_as_new_generation(before, after, chunks)
        else:
            self._registry.put(after)

    def _rewrite_as_new_generation(
        self, before: DocumentRecord, after: DocumentRecord, chunks: list[ChunkRecord]
    ) -> None:
        """For servers whose upsert breaks partition-key routing: the same crash-safe steps as a
        replacement (the copies under a fresh generation recorded as pending with the document's
        visible fields unchanged, the copies written, then one registry write switches to them with
        the new fields, then the old rows go; recovery or the repair finishes any of them), with the
        stored vectors, so nothing is embedded again. Chunk ids change."""
        generation = new_generation()
        new_ids = {c.chunk_id: chunk_id_for(c.tenant, c.document_id, generation, c.chunk_index) for c in chunks}
        copies = [
            dataclasses.replace(
                c, chunk_id=new_ids[c.chunk_id], generation=generation, parent_id=new_ids.get(c.parent_id, c.parent_id)
            )
            for c in chunks
        ]
        pending = DocumentRecord(**{**before.__dict__})
        pending.pending_generation = generation
        self._registry.put(pending)
        self._chunks.insert_chunks(copies)
        after.generation, after.pending_generation, after.stale_generation = generation, "", before.generation
        self._registry.put(after)  # the old rows go after the grace period (_rewrite_or_repair)

    def _repair_fields(self, attempted: DocumentRecord) -> None:
        """After a failed update: a copy that did not switch is rolled back, a replaced generation's
        rows go, and the chunks get the fields of the stored record."""
        stored = self._registry.get(attempted.tenant, attempted.document_id)
        if stored is None or stored.deleting or stored.state != DocumentState.ACTIVE:
            return
        if stored.pending_generation or stored.stale_generation:
            settle_failed_attempt(self._registry, self._chunks, stored, stored.pending_generation, None)
            stored = self._registry.get(attempted.tenant, attempted.document_id)
            if stored is None or stored.state != DocumentState.ACTIVE:
                return
        if stored.generation:
            repaired = DocumentRecord(**{**stored.__dict__})
            self._rewrite(stored, repaired)
            if repaired.stale_generation:  # a copy under a fresh generation (Milvus 2.3): the old rows go now
                settle_failed_attempt(self._registry, self._chunks, repaired, "", None)

    async def delete(self, tenant: str, document_id: str) -> int:
        """Deletes the document: its attempts in flight are cancelled and rolled back first, then the
        chunks go, then the registry row (a crash in between is finished by recovery; a failed store
        call by a retry of the delete, or in the background once the store answers). Returns the
        number of chunks deleted."""
        self._may_write()
        key = document_key(tenant, document_id)
        cancelled = [task for task in self._attempts.get(key, ()) if not task.done()]
        for task in cancelled:
            self._deleted.add(task)
            task.cancel()
        if cancelled:
            logger.info("delete of %s cancels %d ingestion(s) of it", document_id, len(cancelled))
        async with self._lock(key):
            record = await self._store(self._registry.get, tenant, document_id)
            if record is None:
                if cancelled:
                    return 0
                raise errors.NotFoundError(
                    f"document {document_id!r} does not exist", metadata={"document_id": document_id}
                )
            try:
                return await finish_despite_cancel(self._store(self._delete, record))
            except errors.RagrpcError as exc:
                logger.warning("the delete of %s failed (%s); finishing it in the background", document_id, exc)
                self._settle_later(tenant, document_id, lambda: self._finish_delete(tenant, document_id))
                raise

    def _delete(self, record: DocumentRecord) -> int:
        """Marks the record (it disappears from reads), deletes the chunks, then the row. A record
        already marked (a delete whose store call failed) is finished."""
        if not record.deleting:
            record.deleting = True
            self._registry.put(record)
        deleted = self._chunks.delete_chunks(chunks_of_document(record.tenant, record.document_id))
        self._registry.delete(record.tenant, record.document_id)
        return deleted or record.chunk_count

    def _finish_delete(self, tenant: str, document_id: str) -> None:
        stored = self._registry.get(tenant, document_id)
        if stored is not None and stored.deleting:
            self._delete(stored)

    # ---- settling failed attempts -----------------------------------------------------------------

    @property
    def unsettled(self) -> int:
        """Failed attempts, updates and deletes whose bookkeeping waits for the store to come back."""
        return len(self._settling)

    async def close(self) -> None:
        """Stops waiting for the store; what is still unsettled is finished by recovery at start."""
        for task in list(self._settling):
            task.cancel()
        await asyncio.gather(*self._settling, return_exceptions=True)

    def _settle(self, attempt: DocumentRecord, generation: str, error: errors.RagrpcError | None) -> None:
        settle_failed_attempt(self._registry, self._chunks, attempt, generation, error)

    def _settle_later(
        self, tenant: str, document_id: str, step: Callable[[], None], *, first_delay_s: float | None = None
    ) -> None:
        """Runs `step` (store calls, in a store thread) under the document's lock after `first_delay_s`
        (default: the first retry delay), then as soon as the store answers, retrying with backoff;
        stops when this process may no longer write."""
        task = asyncio.get_running_loop().create_task(
            self._settle_when_reachable(tenant, document_id, step, first_delay_s)
        )
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle_when_reachable(
        self, tenant: str, document_id: str, step: Callable[[], None], first_delay_s: float | None
    ) -> None:
        tries = 0
        while True:
            delay = self._settle_delays[min(tries, len(self._settle_delays) - 1)]
            await asyncio.sleep(first_delay_s if tries == 0 and first_delay_s is not None else delay)
            tries += 1
            try:
                self._may_write()
                async with self._lock(document_key(tenant, document_id)):
                    await self._store(step)
            except errors.PreconditionError as exc:  # the writer lease is lost: the next holder recovers
                logger.warning("settling %s stopped: %s", document_id, exc.message)
                return
            except errors.RagrpcError as exc:
                logger.info("settling %s: store still unreachable (%s)", document_id, exc.message)
                continue
            except Exception:  # noqa: BLE001 - supervised: keep trying (recovery at start is the backstop)
                logger.exception("settling %s failed unexpectedly; trying again", document_id)
                continue
            logger.info("settled %s after %d tries", document_id, tries)
            return

    # ---- recovery at start ------------------------------------------------------------------------

    def recover(self) -> dict[str, int]:
        """Run by the writer at start, before it serves (ingest_service.recovery.recover_documents)."""
        return recover_documents(self._registry, self._chunks)
