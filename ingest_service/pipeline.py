"""The ingestion pipeline of one document:

    register (hash, state) -> extract -> clean -> metadata -> chunk -> embed (batched, off the
    event loop) -> write new chunks -> switch the registry to them -> drop the old chunks

Crash safety: chunks are written under a fresh `generation`; queries show only chunks whose
generation is the registry's current one, so until the registry switch the old version
(or nothing) is visible, and after it the new one. Every change of the document's lifecycle
fields (begin, commit, fail, and the locks that order them against update and delete) is made
by `DocumentLifecycle`; this module does the work in between (extract, chunk, embed, write).

Where the work runs: the lifecycle, the embedding calls and the store writes stay on the event loop
and its threads; a document's preparation (extract, clean, metadata, chunk, frame what is embedded
and what BM25 indexes: ingest_service.preparation) runs on one of the document worker processes
(ingest_service.document_workers, RAGRPC_INGEST_PROCESSES) when there are some, so the service's
interpreter only moves the bytes in and the drafts out.

Cancellation: an attempt cancelled by a delete of its document, by the document timeout or at
shutdown is rolled back (after its store writes still running have finished) before the
cancellation goes on; a delete turns into ABORTED for whoever waited for the ingestion.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

import numpy as np

from ingest_service.attempts import Attempt
from ingest_service.byte_budget import ByteBudget
from ingest_service.chunk_records import build_chunk_records, mean_direction
from ingest_service.document_facts import DocumentFacts
from ingest_service.document_workers import DocumentWorkers
from ingest_service.embed_batcher import EmbeddingBatcher
from ingest_service.lifecycle import DocumentLifecycle
from ingest_service.preparation import (
    ChunkPlanner,
    DocumentExtractor,
    DocumentPreparer,
    ExtractionStats,
    FramedDocument,
    needs_model,
)
from ingest_service.requests import IngestItem, derived_document_id, validate_spec
from ingest_service.reupload import reingest_reason
from ragrpc import errors
from ragrpc.embeddings import Embedder
from ragrpc.enrich import Enrichers
from ragrpc.models import ChunkDraft, ChunkKind, DocumentRecord, DocumentState, ExtractedDocument
from ragrpc.store.base import ChunkStore
from ragrpc.tokens import TokenCounter
from ragrpc.tracing import NoopTracer, SpanHandle, Tracer

logger = logging.getLogger(__name__)

__all__ = ["ChunkPlanner", "DocumentExtractor", "IngestOutcome", "IngestPipeline", "ProgressEvent"]


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
    error_reason: str = ""
    error_metadata: dict[str, str] = field(default_factory=dict)

    @classmethod
    def failed(cls, document_id: str, error: errors.RagrpcError) -> ProgressEvent:
        return cls(
            document_id,
            "done",
            DocumentState.FAILED,
            error=error.message,
            error_code=errors.status_name(error),
            error_reason=error.reason,
            error_metadata={str(k): str(v) for k, v in error.metadata.items()},
        )


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
        lifecycle: DocumentLifecycle,
        executor: Executor,
        embed_batch_size: int = 64,
        document_timeout_s: float = 900.0,
        clean: Callable[[ExtractedDocument], ExtractedDocument] = lambda d: d,
        observer: ProgressCallback | None = None,
        memory: ByteBudget | None = None,
        tracer: Tracer | None = None,
        context_headers: bool = False,
        header_counter: TokenCounter | None = None,
        enrichers: Enrichers | None = None,
        workers: DocumentWorkers | None = None,
    ) -> None:
        """workers: the processes that prepare documents (extract, clean, chunk, frame); None: the
        preparation runs in `executor`'s threads. Documents whose chunking calls the model (the
        semantic strategy) are prepared in `executor` either way."""
        self._enrichers = enrichers  # document-level knowledge (ragrpc.enrich; RAGRPC_ENRICHERS); None: none
        self._tracer = tracer or NoopTracer()  # stage spans: extract, chunk, embed, write
        self._memory = memory or ByteBudget(1 << 62)
        self._planner = planner
        self._workers = workers
        # the counter that cuts context headers is made once (a counter copies the model's tokenizer:
        # ~15 ms, which per document on the event loop cost ingestion a third of its rate)
        self._preparer = DocumentPreparer(
            extractor=extractor,
            planner=planner,
            clean=clean,
            enrichers=enrichers,
            context_headers=context_headers,
            header_counter=(lambda: header_counter) if header_counter is not None else embedder.token_counter,
            window=embedder.max_tokens,
        )
        self._embedder = embedder
        self._batcher = batcher
        self._chunks = chunks
        self._lifecycle = lifecycle
        self._executor = executor
        self._batch = embed_batch_size
        self._timeout_s = document_timeout_s
        self._observer = observer

    async def _run(self, fn, *args):  # type: ignore[no-untyped-def]
        """CPU work (extraction, chunking) in the CPU executor."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def ingest(
        self,
        item: IngestItem,
        progress: ProgressCallback | None = None,
        *,
        slot: AbstractAsyncContextManager[None] | None = None,
    ) -> IngestOutcome:
        """Ingests `item` (waiting for `slot` first, when given). Raises a RagrpcError when it fails
        (the document is then FAILED, or, for a replacement, still ACTIVE with its previous
        content); AbortedError when the document was deleted meanwhile."""
        report = self._reporter(progress)
        validate_spec(item.spec)
        # Hashing a large upload would hold up the event loop (every stream and health check).
        small = item.size < _HASH_ON_LOOP_BYTES
        content_hash = item.content_hash if small else await self._run(getattr, item, "content_hash")
        document_id = item.spec.document_id or derived_document_id(content_hash)
        task = asyncio.current_task()
        # The document timeout runs from submission: waiting for a slot and for the document's lock
        # counts, so a document stuck in a long queue ends instead of waiting for ever.
        deadline = asyncio.get_running_loop().time() + self._timeout_s
        try:
            with self._lifecycle.registered(item.tenant, document_id):
                async with contextlib.AsyncExitStack() as held:
                    try:
                        async with asyncio.timeout_at(deadline):
                            await held.enter_async_context(slot or contextlib.nullcontext())
                            await held.enter_async_context(self._lifecycle.attempt_lock(item.tenant, document_id))
                    except TimeoutError:
                        waited = errors.DeadlineError(
                            f"the document waited {self._timeout_s:.0f}s for its turn and was not ingested "
                            "(RAGRPC_DOCUMENT_TIMEOUT_S); retry it when the service is less busy",
                            reason="DOCUMENT_TIMEOUT",
                            metadata={"document_id": document_id},
                        )
                        report(ProgressEvent.failed(document_id, waited))
                        raise waited from None
                    return await self._ingest_locked(item, document_id, content_hash, report, deadline)
        except asyncio.CancelledError:
            if not self._lifecycle.deleted_during(task):
                raise
            assert task is not None
            task.uncancel()
            error = errors.AbortedError(
                f"document {document_id!r} was deleted while it was being ingested",
                reason="DELETED_DURING_INGESTION",
                metadata={"document_id": document_id},
            )
            report(ProgressEvent.failed(document_id, error))
            raise error from None

    def _reporter(self, progress: ProgressCallback | None) -> ProgressCallback:
        observer = self._observer

        def report(event: ProgressEvent) -> None:
            if observer is not None:
                observer(event)
            if progress is not None:
                progress(event)

        return report

    async def _ingest_locked(
        self, item: IngestItem, document_id: str, content_hash: str, report: ProgressCallback, deadline: float
    ) -> IngestOutcome:
        collection = item.spec.collection or "default"
        existing = await self._lifecycle.current(item.tenant, document_id)
        stored = (
            existing is not None
            and existing.state == DocumentState.ACTIVE
            and existing.content_hash == content_hash
            and existing.collection == collection
        )
        reason = reingest_reason(existing, item.spec) if stored and existing is not None else ""
        if reason:
            logger.info("document %r: same content, ingested again: %s", document_id, reason)
        if stored and existing is not None and not reason:
            if item.spec.tags and list(item.spec.tags) != existing.tags:  # no other chunks, no re-embedding
                existing = await self._lifecycle.retag_held(existing, list(item.spec.tags))
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
        attempt = self._lifecycle.new_attempt(
            item.tenant, document_id, collection=collection, content_hash=content_hash, existing=existing
        )
        try:
            async with asyncio.timeout_at(deadline):
                await self._lifecycle.begin(attempt)
                report(ProgressEvent(document_id, "queued", attempt.record.state))
                return await self._process(item, attempt, report)
        except TimeoutError:
            error: errors.RagrpcError = errors.DeadlineError(
                f"ingestion took longer than {self._timeout_s:.0f}s from its submission and was abandoned "
                "(RAGRPC_DOCUMENT_TIMEOUT_S)",
                reason="DOCUMENT_TIMEOUT",
            )
            await self._fail(attempt, error, report)
            raise error from None
        except errors.RagrpcError as exc:
            await self._fail(attempt, exc, report)
            raise
        except asyncio.CancelledError:
            if self._lifecycle.deleted_during(asyncio.current_task()):
                # rolled back here; `ingest` reports the ABORTED outcome (the delete then removes the record)
                await self._lifecycle.fail(attempt, errors.AbortedError("deleted while it was being ingested"))
            else:
                stopped = errors.AbortedError("the ingest service stopped during the ingestion; ingest it again")
                await self._fail(attempt, stopped, report)
            raise
        except Exception as exc:
            logger.exception("ingestion of %s failed unexpectedly", document_id)
            wrapped = errors.InternalError(f"ingestion failed unexpectedly: {type(exc).__name__}: {exc}")
            await self._fail(attempt, wrapped, report)
            raise wrapped from exc

    async def _process(self, item: IngestItem, attempt: Attempt, report: ProgressCallback) -> IngestOutcome:
        record = attempt.record
        doc_id, state = record.document_id, record.state
        report(ProgressEvent(doc_id, "extracting", state))
        async with self._memory.hold(item.size):  # the bytes, the text and the drafts are in memory here
            facts, framed = await self._prepare(item, lambda: report(ProgressEvent(doc_id, "chunking", state)))
        drafts = framed.drafts
        if not drafts:
            if record.state != DocumentState.ACTIVE:  # a replacement keeps the facts of its old version
                facts.apply_to(record)  # the FAILED record shows the pages without text, page count, title
            raise errors.InvalidInputError(framed.no_text, reason="NO_TEXT")
        facts.chunker = drafts[0].chunker.split("/")[0]
        with self._tracer.span(
            "embed", **{"gen_ai.operation.name": "embeddings", "gen_ai.request.model": self._embedder.model_id}
        ) as span:
            written = await self._embed_and_write(item, attempt, facts, framed, report)
            span.set(chunks=written, batches=-(-written // self._batch) if written else 0)
        facts.apply_to(record)
        with self._tracer.span("write", generation=attempt.generation, replacing=attempt.existing is not None):
            committed = await self._lifecycle.commit(
                attempt, sum(1 for d in drafts if d.kind == 0), max(d.chunk_index for d in drafts) + 1
            )
        report(ProgressEvent(doc_id, "done", DocumentState.ACTIVE, committed.chunk_count, written))
        return IngestOutcome(committed, unchanged=False, chunks_written=written)

    async def _prepare(self, item: IngestItem, chunking: Callable[[], None]) -> tuple[DocumentFacts, FramedDocument]:
        """Extracts, cleans, gathers facts, chunks and frames the document (ingest_service.preparation)
        on a worker process, or in the CPU executor (no workers, or a chunking that calls the model);
        `chunking()` once it is extracted. Two stages, two trace spans: extract and chunk."""
        fields = self._chunks.metadata_fields
        extract_span = self._tracer.span(
            "extract", size_bytes=item.size, media_type=item.spec.media_type or None, file_name=item.spec.file_name
        )
        if self._workers is None or needs_model(item.spec):
            with extract_span as span:
                extracted, facts = await self._run(self._preparer.extract, item, fields)
                _set_extraction(span, ExtractionStats.of(extracted))
            chunking()
            with self._tracer.span("chunk", strategy=item.spec.chunking_strategy) as span:
                framed = await self._run(self._preparer.frame, item, extracted, facts)
                _set_chunking(span, framed)
            return facts, framed
        preparation = self._workers.submit(item, fields)
        try:
            with extract_span as span:
                _set_extraction(span, await preparation.extracted())
            chunking()
            with self._tracer.span("chunk", strategy=item.spec.chunking_strategy) as span:
                prepared = await preparation.prepared()
                _set_chunking(span, prepared.framed)
        finally:
            preparation.cancel()  # a no-op once it ended: else it stops the worker still busy with it
        if self._enrichers is not None:
            for name in prepared.enricher_failures:  # the worker's enrichers failed: counted here
                self._enrichers.count_failure(name)
        return prepared.facts, prepared.framed

    async def _embed_and_write(
        self,
        item: IngestItem,
        attempt: Attempt,
        facts: DocumentFacts,
        framed: FramedDocument,
        report: ProgressCallback,
    ) -> int:
        """Embeds retrievable drafts (as `framed.embedded_texts`, one per retrievable draft) in batches;
        writing batch k overlaps embedding batch k+1. PARENT drafts (context only) are not
        embedded: they get the normalised mean of their children's vectors."""
        record, generation = attempt.record, attempt.generation
        drafts, embedded_texts = framed.drafts, framed.embedded_texts
        analysed = (
            dict(zip((d.chunk_index for d in drafts), framed.bm25_terms, strict=True)) if framed.bm25_terms else {}
        )

        def terms(batch: list[ChunkDraft]) -> list[str] | None:
            return [analysed[d.chunk_index] for d in batch] if analysed else None

        searchable = [d for d in drafts if d.kind == ChunkKind.RETRIEVABLE]
        parents = [d for d in drafts if d.kind == ChunkKind.PARENT]
        total = len(searchable)
        report(ProgressEvent(record.document_id, "embedding", record.state, total, 0))
        pending_write: asyncio.Future[None] | None = None
        child_vectors: dict[int, list[np.ndarray]] = {}
        embedded = 0
        try:
            for start in range(0, total, self._batch):
                batch = searchable[start : start + self._batch]
                vectors = await self._batcher.embed(embedded_texts[start : start + self._batch])
                for draft, vector in zip(batch, vectors, strict=True):
                    if draft.parent_index >= 0:
                        child_vectors.setdefault(draft.parent_index, []).append(vector)
                rows = build_chunk_records(item, record.document_id, facts, batch, vectors, generation, terms(batch))
                if pending_write is not None:
                    await pending_write
                pending_write = asyncio.ensure_future(attempt.call(self._chunks.insert_chunks, rows))
                embedded += len(batch)
                report(ProgressEvent(record.document_id, "embedding", record.state, total, embedded))
            report(ProgressEvent(record.document_id, "writing", record.state, total, embedded))
            if pending_write is not None:
                await pending_write
        finally:
            if pending_write is not None and not pending_write.done():
                pending_write.cancel()  # the write itself runs on; the rollback waits for it
        if parents:
            vectors = np.stack(
                [mean_direction(child_vectors.get(p.chunk_index, []), self._embedder.dimension) for p in parents]
            )
            rows = build_chunk_records(item, record.document_id, facts, parents, vectors, generation, terms(parents))
            await attempt.call(self._chunks.insert_chunks, rows)
        return embedded

    async def _fail(self, attempt: Attempt, error: errors.RagrpcError, report: ProgressCallback) -> None:
        await self._lifecycle.fail(attempt, error)
        report(ProgressEvent.failed(attempt.record.document_id, error))


def _set_extraction(span: SpanHandle, stats: ExtractionStats) -> None:
    span.set(media_type=stats.media_type, blocks=stats.blocks, chars=stats.chars)


def _set_chunking(span: SpanHandle, framed: FramedDocument) -> None:
    span.set(chunks=len(framed.drafts), chunker=framed.drafts[0].chunker if framed.drafts else None)
