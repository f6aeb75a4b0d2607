"""The ingestion pipeline of one document:

    register (hash, state) -> extract -> clean -> metadata -> chunk -> embed (batched, off the
    event loop) -> write new chunks -> switch the registry to them -> drop the old chunks

Crash safety: chunks are written under a fresh `generation`; queries show only chunks whose
generation is the registry's current one, so until the registry switch the old version
(or nothing) is visible, and after it the new one. Every change of the document's lifecycle
fields (begin, commit, fail, and the locks that order them against update and delete) is made
by `DocumentLifecycle`; this module does the work in between (extract, chunk, embed, write).

Cancellation: an attempt cancelled by a delete of its document, by the document timeout or at
shutdown is rolled back (after its store writes still running have finished) before the
cancellation goes on; a delete turns into ABORTED for whoever waited for the ingestion.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import traceback
from collections.abc import Callable
from concurrent.futures import Executor
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ingest_service.attempts import Attempt
from ingest_service.byte_budget import ByteBudget
from ingest_service.chunk_records import build_chunk_records, mean_direction
from ingest_service.document_facts import DocumentFacts, gather_facts, no_text_message
from ingest_service.embed_batcher import EmbeddingBatcher
from ingest_service.lifecycle import DocumentLifecycle
from ingest_service.requests import IngestItem, derived_document_id, validate_spec
from ingest_service.reupload import reingest_reason
from ragrpc import errors
from ragrpc.context_header import embedded_text
from ragrpc.embeddings import Embedder
from ragrpc.enrich import Enrichers
from ragrpc.models import ChunkDraft, ChunkKind, DocumentRecord, DocumentState, ExtractedDocument
from ragrpc.store.base import ChunkStore
from ragrpc.tokens import KeptShortCounts, TokenCounter
from ragrpc.tracing import NoopTracer, Tracer

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
    ) -> None:
        self._enrichers = enrichers  # document-level knowledge (ragrpc.enrich; RAGRPC_ENRICHERS); None: none
        self._context_headers = context_headers
        # counts model tokens to cut context headers; made once (a counter copies the model's
        # tokenizer: ~15 ms, which per document on the event loop cost ingestion a third of its rate)
        self._header_counter = header_counter
        self._tracer = tracer or NoopTracer()  # stage spans: extract, chunk, embed, write
        self._memory = memory or ByteBudget(1 << 62)
        self._extractor = extractor
        self._planner = planner
        self._embedder = embedder
        self._batcher = batcher
        self._chunks = chunks
        self._lifecycle = lifecycle
        self._executor = executor
        self._batch = embed_batch_size
        self._timeout_s = document_timeout_s
        self._clean = clean
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
            with self._tracer.span(
                "extract", size_bytes=item.size, media_type=item.spec.media_type or None, file_name=item.spec.file_name
            ) as span:
                extracted, facts = await self._run(self._extract_and_gather, item)
                span.set(media_type=extracted.media_type, blocks=len(extracted.blocks), chars=len(extracted.text))
            report(ProgressEvent(doc_id, "chunking", state))
            with self._tracer.span("chunk", strategy=item.spec.chunking_strategy) as span:
                drafts, embedded_texts = await self._run(self._plan_and_frame, item, extracted, facts)
                span.set(chunks=len(drafts), chunker=drafts[0].chunker if drafts else None)
            if not drafts:
                if record.state != DocumentState.ACTIVE:  # a replacement keeps the facts of its old version
                    facts.apply_to(record)  # the FAILED record shows the pages without text, page count, title
                raise errors.InvalidInputError(no_text_message(extracted), reason="NO_TEXT")
            del extracted  # only the drafts are needed from here
        facts.chunker = drafts[0].chunker.split("/")[0]
        with self._tracer.span(
            "embed", **{"gen_ai.operation.name": "embeddings", "gen_ai.request.model": self._embedder.model_id}
        ) as span:
            written = await self._embed_and_write(item, attempt, facts, drafts, embedded_texts, report)
            span.set(chunks=written, batches=-(-written // self._batch) if written else 0)
        facts.apply_to(record)
        with self._tracer.span("write", generation=attempt.generation, replacing=attempt.existing is not None):
            committed = await self._lifecycle.commit(attempt, sum(1 for d in drafts if d.kind == 0))
        report(ProgressEvent(doc_id, "done", DocumentState.ACTIVE, committed.chunk_count, written))
        return IngestOutcome(committed, unchanged=False, chunks_written=written)

    # The per-document CPU work runs in the executor, two calls a document: extraction with the
    # document's facts (language guess, the enrichers' facts and header terms), then chunking with the
    # texts to embed (context headers cut by model tokens). On the event loop, the facts and the
    # headers took 25 % of its time at 2,500 documents (py-spy), and every document's progress
    # and store calls waited behind them.
    def _extract_and_gather(self, item: IngestItem) -> tuple[ExtractedDocument, DocumentFacts]:
        extracted = self._extract_and_clean(item)
        return extracted, gather_facts(item, extracted, self._enrichers, self._chunks.metadata_fields)

    def _plan_and_frame(
        self, item: IngestItem, extracted: ExtractedDocument, facts: DocumentFacts
    ) -> tuple[list[ChunkDraft], list[str]]:
        """The drafts, and what is embedded of each retrievable one (in their order)."""
        spec = item.spec
        drafts = self._planner.plan(
            extracted, spec.chunking_strategy, spec.chunk_size_tokens, spec.chunk_overlap_tokens
        )
        text = self._embedded_text(facts.title, {**facts.facts, **spec.metadata})
        return drafts, [text(d) for d in drafts if d.kind == ChunkKind.RETRIEVABLE]

    def _extract_and_clean(self, item: IngestItem) -> ExtractedDocument:
        try:
            extracted = self._extractor.extract(
                item.read(), file_name=item.spec.file_name, media_type=item.spec.media_type, password=item.spec.password
            )
        except Exception as exc:
            # The traceback's frames hold the document's bytes (and a parser's state) until the error
            # is collected, which is after the memory budget was given to the next document.
            _clear_frames(exc)
            raise
        return self._clean(extracted)

    async def _embed_and_write(
        self,
        item: IngestItem,
        attempt: Attempt,
        facts: DocumentFacts,
        drafts: list[ChunkDraft],
        embedded_texts: list[str],
        report: ProgressCallback,
    ) -> int:
        """Embeds retrievable drafts (as `embedded_texts`, one per retrievable draft) in batches;
        writing batch k overlaps embedding batch k+1. PARENT drafts (context only) are not
        embedded: they get the normalised mean of their children's vectors."""
        record, generation = attempt.record, attempt.generation
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
                rows = build_chunk_records(item, record.document_id, facts, batch, vectors, generation)
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
            rows = build_chunk_records(item, record.document_id, facts, parents, vectors, generation)
            await attempt.call(self._chunks.insert_chunks, rows)
        return embedded

    def _embedded_text(self, title: str, metadata: dict[str, str]) -> Callable[[ChunkDraft], str]:
        """What is embedded of a draft: its text, after its context header when those are on, the
        header cut to what the draft leaves free of the model's window (`header_budget`)."""
        if not self._context_headers:
            return lambda draft: draft.text
        if self._header_counter is None:
            self._header_counter = self._embedder.token_counter()
        # a document's chunks share their header: its count is kept for the next chunk
        counter, window = KeptShortCounts(self._header_counter), self._embedder.max_tokens

        return lambda draft: embedded_text(
            title, draft.section_path, metadata, draft.text, counter, window, draft.token_bound
        )

    async def _fail(self, attempt: Attempt, error: errors.RagrpcError, report: ProgressCallback) -> None:
        await self._lifecycle.fail(attempt, error)
        report(ProgressEvent.failed(attempt.record.document_id, error))


def _clear_frames(exc: BaseException) -> None:
    """Drops the local variables of the frames in `exc`'s traceback and in those of its causes."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if current.__traceback__ is not None:
            traceback.clear_frames(current.__traceback__)
        current = current.__cause__ or current.__context__
