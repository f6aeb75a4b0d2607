"""The ingestion pipeline of one document:

    register (hash, state) -> extract -> clean -> metadata -> chunk -> embed (batched, off the
    event loop) -> write new chunks -> switch the registry to them -> drop the old chunks

Crash safety: chunks are written under a fresh `generation`; queries show only chunks whose
generation is the registry's current one, so until the registry switch the old version
(or nothing) is visible, and after it the new one. Leftovers of an interrupted attempt are
recorded in the registry (`pending_generation`, `stale_generation`) and removed by
`DocumentRecovery` at the next start. A failed attempt whose bookkeeping the store refused
(Milvus unreachable) is settled in the background as soon as the store answers again, so
no document stays PROCESSING until a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ingest_service.attempt_settling import settle_attempt
from ingest_service.chunk_records import build_chunk_records, mean_direction, new_generation
from ingest_service.document_facts import DocumentFacts, gather_facts, no_text_message
from ingest_service.embed_batcher import EmbeddingBatcher
from ingest_service.requests import IngestItem, derived_document_id, validate_spec
from ingest_service.stale_chunks import chunks_of_generation
from ragrpc import errors
from ragrpc.embeddings import Embedder
from ragrpc.models import ChunkDraft, ChunkKind, DocumentRecord, DocumentState, ExtractedDocument
from ragrpc.store.base import ChunkStore, DocumentRegistry

logger = logging.getLogger(__name__)


class DocumentExtractor(Protocol):
    def extract(
        self, data: bytes, *, file_name: str = "", media_type: str = "", password: str = ""
    ) -> ExtractedDocument: ...


class ChunkPlanner(Protocol):
    """Turns an extracted document into chunk drafts for a strategy and sizes."""

    def plan(self, document: ExtractedDocument, strategy: str, size: int, overlap: int) -> list[ChunkDraft]: ...


@dataclass
class ProgressEvent:
    document_id: str
    stage: str  # queued, extracting, chunking, embedding, writing, done
    state: DocumentState
    chunk_count: int = 0
    chunks_embedded: int = 0
    error: str = ""
    error_code: str = ""
    unchanged: bool = False


@dataclass
class IngestOutcome:
    record: DocumentRecord
    unchanged: bool
    chunks_written: int


ProgressCallback = Callable[[ProgressEvent], None]

_HASH_ON_LOOP_BYTES = 1 << 20  # larger contents are hashed in the CPU executor


class IngestPipeline:
    """Ingests one document at a time; many can run concurrently on one event loop."""

    def __init__(
        self,
        *,
        extractor: DocumentExtractor,
        planner: ChunkPlanner,
        embedder: Embedder,
        batcher: EmbeddingBatcher,
        chunks: ChunkStore,
        registry: DocumentRegistry,
        executor: Executor,
        store_executor: Executor | None = None,
        embed_batch_size: int = 64,
        document_timeout_s: float = 900.0,
        clean: Callable[[ExtractedDocument], ExtractedDocument] = lambda d: d,
        observer: ProgressCallback | None = None,
        settle_delays_s: Sequence[float] = (0.5, 1.0, 2.0, 5.0, 10.0),
    ) -> None:
        self._extractor = extractor
        self._planner = planner
        self._embedder = embedder
        self._batcher = batcher
        self._chunks = chunks
        self._registry = registry
        self._executor = executor
        self._store_executor = store_executor or executor
        self._batch = embed_batch_size
        self._timeout_s = document_timeout_s
        self._clean = clean
        self._observer = observer
        self._locks: dict[str, asyncio.Lock] = {}
        self._settling: set[asyncio.Task[None]] = set()
        self._settle_delays = settle_delays_s

    async def _run(self, fn, *args):  # type: ignore[no-untyped-def]
        """CPU work (extraction, chunking) in the CPU executor."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _store(self, fn, *args):  # type: ignore[no-untyped-def]
        """A store call in the store executor: its threads mostly wait on the store, and the more
        writes wait at once, the more the store's group commit sends in one call."""
        return await asyncio.get_running_loop().run_in_executor(self._store_executor, fn, *args)

    async def ingest(self, item: IngestItem, progress: ProgressCallback | None = None) -> IngestOutcome:
        """Ingests `item`. Raises a RagrpcError when it fails (the document is then FAILED,
        or, for a replacement, still ACTIVE with its previous content)."""
        report = self._reporter(progress)
        validate_spec(item.spec)
        # Hashing a large upload would hold up the event loop (every stream and health check).
        small = len(item.content) < _HASH_ON_LOOP_BYTES
        content_hash = item.content_hash if small else await self._run(getattr, item, "content_hash")
        document_id = item.spec.document_id or derived_document_id(content_hash)
        async with self._document_lock(item.tenant, document_id):
            return await self._ingest_locked(item, document_id, content_hash, report)

    @contextlib.asynccontextmanager
    async def _document_lock(self, tenant: str, document_id: str) -> AsyncIterator[None]:
        """One attempt (or settling of an attempt) per document at a time, in this process."""
        key = f"{tenant}/{document_id}"
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            try:
                yield
            finally:
                if not lock._waiters:  # type: ignore[attr-defined]
                    self._locks.pop(key, None)

    @property
    def unsettled(self) -> int:
        """Failed attempts whose bookkeeping waits for the store to come back."""
        return len(self._settling)

    async def close(self) -> None:
        """Stops waiting for the store; what is still unsettled is finished by recovery at start."""
        for task in list(self._settling):
            task.cancel()
        await asyncio.gather(*self._settling, return_exceptions=True)

    def _reporter(self, progress: ProgressCallback | None) -> ProgressCallback:
        observer = self._observer

        def report(event: ProgressEvent) -> None:
            if observer is not None:
                observer(event)
            if progress is not None:
                progress(event)

        return report

    async def _ingest_locked(
        self, item: IngestItem, document_id: str, content_hash: str, report: ProgressCallback
    ) -> IngestOutcome:
        collection = item.spec.collection or "default"
        existing = await self._store(self._registry.get, item.tenant, document_id)
        if existing is not None and (existing.pending_generation or existing.stale_generation):
            # An earlier attempt ended without finishing its bookkeeping (the store was unreachable when
            # it failed or switched; this process is the only writer and holds the document's lock): drop
            # those chunks now, before the markers are overwritten, or they would be left behind for good.
            for leftover in (existing.pending_generation, existing.stale_generation):
                if leftover:
                    await self._store(
                        self._chunks.delete_chunks, chunks_of_generation(item.tenant, document_id, leftover)
                    )
            existing.pending_generation = existing.stale_generation = ""
            if existing.state == DocumentState.ACTIVE:
                await self._store(self._registry.put, existing)
        if (
            existing
            and existing.state == DocumentState.ACTIVE
            and existing.content_hash == content_hash
            and existing.collection == collection
        ):
            report(
                ProgressEvent(
                    document_id,
                    "done",
                    DocumentState.ACTIVE,
                    existing.chunk_count,
                    existing.chunk_count,
                    unchanged=True,
                )
            )
            return IngestOutcome(existing, unchanged=True, chunks_written=0)
        generation = new_generation()
        record = self._start_record(item, document_id, collection, content_hash, existing, generation)
        await self._store(self._registry.put, record)
        report(ProgressEvent(document_id, "queued", record.state))
        try:
            return await asyncio.wait_for(self._process(item, record, existing, report), self._timeout_s)
        except asyncio.TimeoutError:
            error: errors.RagrpcError = errors.DeadlineError(
                f"ingestion took longer than {self._timeout_s:.0f}s and was abandoned"
            )
            await self._fail(record, generation, error, report)
            raise error from None
        except errors.RagrpcError as exc:
            await self._fail(record, generation, exc, report)
            raise
        except Exception as exc:
            logger.exception("ingestion of %s failed unexpectedly", document_id)
            wrapped = errors.InternalError(f"ingestion failed unexpectedly: {type(exc).__name__}: {exc}")
            await self._fail(record, generation, wrapped, report)
            raise wrapped from exc

    def _start_record(
        self,
        item: IngestItem,
        document_id: str,
        collection: str,
        content_hash: str,
        existing: DocumentRecord | None,
        generation: str,
    ) -> DocumentRecord:
        now = int(time.time())
        if existing is not None:
            record = DocumentRecord(**{**existing.__dict__})
        else:
            record = DocumentRecord(tenant=item.tenant, document_id=document_id, created_at=now)
        record.collection = collection
        record.pending_generation = generation
        replacing = existing is not None and existing.state == DocumentState.ACTIVE
        # A replacement keeps the old version visible (and ACTIVE) until the switch.
        record.state = DocumentState.ACTIVE if replacing else DocumentState.PROCESSING
        if not replacing:
            record.content_hash = content_hash
        return record

    async def _process(
        self, item: IngestItem, record: DocumentRecord, existing: DocumentRecord | None, report: ProgressCallback
    ) -> IngestOutcome:
        doc_id, state = record.document_id, record.state
        report(ProgressEvent(doc_id, "extracting", state))
        extracted = await self._run(self._extract_and_clean, item)
        # bounded work (language guess on the first characters): on the loop; the executor measured 3-4 % slower
        facts = gather_facts(item, extracted)
        report(ProgressEvent(doc_id, "chunking", state))
        drafts = await self._run(
            self._planner.plan,
            extracted,
            item.spec.chunking_strategy,
            item.spec.chunk_size_tokens,
            item.spec.chunk_overlap_tokens,
        )
        if not drafts:
            if record.state != DocumentState.ACTIVE:  # not a replacement (that keeps the facts of its old version)
                facts.apply_to(record)  # the FAILED record shows the pages without text, page count, title
            raise errors.InvalidInputError(no_text_message(extracted), reason="NO_TEXT")
        facts.chunker = drafts[0].chunker.split("/")[0]
        generation = record.pending_generation
        written = await self._embed_and_write(item, record, facts, drafts, generation, report)
        return await self._commit(record, existing, facts, drafts, written, report)

    def _extract_and_clean(self, item: IngestItem) -> ExtractedDocument:
        extracted = self._extractor.extract(
            item.content, file_name=item.spec.file_name, media_type=item.spec.media_type, password=item.spec.password
        )
        return self._clean(extracted)

    async def _embed_and_write(
        self,
        item: IngestItem,
        record: DocumentRecord,
        facts: DocumentFacts,
        drafts: list[ChunkDraft],
        generation: str,
        report: ProgressCallback,
    ) -> int:
        """Embeds retrievable drafts in batches in the executor; writing batch k overlaps
        embedding batch k+1. PARENT drafts (context only) are not embedded: they get the
        normalised mean of their children's vectors."""
        searchable = [d for d in drafts if d.kind == ChunkKind.RETRIEVABLE]
        parents = [d for d in drafts if d.kind == ChunkKind.PARENT]
        total = len(searchable)
        report(ProgressEvent(record.document_id, "embedding", record.state, total, 0))
        pending_write: asyncio.Future[None] | None = None
        child_vectors: dict[int, list[np.ndarray]] = {}
        embedded = 0
        for start in range(0, total, self._batch):
            batch = searchable[start : start + self._batch]
            vectors = await self._batcher.embed([d.text for d in batch])
            for draft, vector in zip(batch, vectors, strict=True):
                if draft.parent_index >= 0:
                    child_vectors.setdefault(draft.parent_index, []).append(vector)
            rows = build_chunk_records(item, record.document_id, facts, batch, vectors, generation)
            if pending_write is not None:
                await pending_write
            pending_write = asyncio.ensure_future(self._store(self._chunks.insert_chunks, rows))
            embedded += len(batch)
            report(ProgressEvent(record.document_id, "embedding", record.state, total, embedded))
        report(ProgressEvent(record.document_id, "writing", record.state, total, embedded))
        if pending_write is not None:
            await pending_write
        if parents:
            vectors = np.stack(
                [mean_direction(child_vectors.get(p.chunk_index, []), self._embedder.dimension) for p in parents]
            )
            rows = build_chunk_records(item, record.document_id, facts, parents, vectors, generation)
            await self._store(self._chunks.insert_chunks, rows)
        return embedded

    async def _commit(
        self,
        record: DocumentRecord,
        existing: DocumentRecord | None,
        facts: DocumentFacts,
        drafts: list[ChunkDraft],
        written: int,
        report: ProgressCallback,
    ) -> IngestOutcome:
        old_generation = existing.generation if existing else ""
        facts.apply_to(record)
        record.generation = record.pending_generation
        record.pending_generation = ""
        record.stale_generation = old_generation
        record.state = DocumentState.ACTIVE
        record.error = record.error_code = ""
        record.chunk_count = sum(1 for d in drafts if d.kind == 0)
        await self._store(self._registry.put, record)  # the switch: new chunks become visible
        if old_generation:
            try:
                await self._store(
                    self._chunks.delete_chunks,
                    chunks_of_generation(record.tenant, record.document_id, old_generation),
                )
                record.stale_generation = ""
                await self._store(self._registry.put, record)
            except errors.RagrpcError as exc:
                # The new version is in place; only removing the old one's chunks (invisible to queries
                # already) waits for the store.
                logger.warning("could not remove the replaced chunks of %s yet: %s", record.document_id, exc)
                self._settle_later(record, "", None)
        report(ProgressEvent(record.document_id, "done", DocumentState.ACTIVE, record.chunk_count, written))
        return IngestOutcome(record, unchanged=False, chunks_written=written)

    async def _fail(
        self,
        record: DocumentRecord,
        generation: str,
        error: errors.RagrpcError,
        report: ProgressCallback,
    ) -> None:
        try:
            await self._store(self._settle, record, generation, error)
        except errors.RagrpcError as exc:
            logger.warning(
                "could not record the failure of %s (%s); retrying until the store is back", record.document_id, exc
            )
            self._settle_later(record, generation, error)
        report(
            ProgressEvent(
                record.document_id,
                "done",
                DocumentState.FAILED,
                error=error.message,
                error_code=errors.status_name(error),
            )
        )

    def _settle(self, attempt: DocumentRecord, generation: str, error: errors.RagrpcError | None) -> None:
        settle_attempt(self._registry, self._chunks, attempt, generation, error)

    def _settle_later(self, attempt: DocumentRecord, generation: str, error: errors.RagrpcError | None) -> None:
        task = asyncio.get_running_loop().create_task(self._settle_when_reachable(attempt, generation, error))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle_when_reachable(
        self, attempt: DocumentRecord, generation: str, error: errors.RagrpcError | None
    ) -> None:
        tries = 0
        while True:
            await asyncio.sleep(self._settle_delays[min(tries, len(self._settle_delays) - 1)])
            tries += 1
            try:
                async with self._document_lock(attempt.tenant, attempt.document_id):
                    await self._store(self._settle, attempt, generation, error)
            except errors.RagrpcError as exc:
                logger.info("settling %s: store still unreachable (%s)", attempt.document_id, exc.message)
                continue
            logger.info("settled the failed attempt of %s after %d tries", attempt.document_id, tries)
            return
