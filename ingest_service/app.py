"""Composition root of the ingest service: builds every component from Settings (or takes
injected ones in tests) and starts the gRPC server."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ingest_service.admission import AdmissionGate
from ingest_service.byte_budget import ByteBudget
from ingest_service.change_journal import JournalledRegistry
from ingest_service.chunk_planner import ChunkPlannerImpl
from ingest_service.document_workers import DocumentWorkers
from ingest_service.documents import DocumentService
from ingest_service.embed_batcher import EmbeddingBatcher
from ingest_service.extract import build_default_registry
from ingest_service.extract.base import ExtractionLimits
from ingest_service.ingestions import Ingestions
from ingest_service.jobs import IngestJobRunner
from ingest_service.lifecycle import DocumentLifecycle
from ingest_service.pipeline import IngestPipeline
from ingest_service.preparation import build_preparer, clean_document
from ingest_service.servicer import IngestServicer
from ingest_service.writer_lease import FencedChunkStore, FencedRegistry, WriterLease
from ragrpc.change_journal import change_journal_enabled
from ragrpc.config import Settings
from ragrpc.embeddings import Embedder
from ragrpc.enrich import build_enrichers
from ragrpc.logging_setup import configure_logging
from ragrpc.metrics import IngestMetricsObserver, Metrics, MetricsInterceptor
from ragrpc.server import RunningServer, ServiceRegistration, host_service
from ragrpc.store.base import ChunkStore, DocumentRegistry
from ragrpc.tokens import TokenCounter
from ragrpc.tracing import NoopTracer, Tracer, tracer_from_setting
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc

logger = logging.getLogger(__name__)

# Store calls in flight: most of them wait (a Milvus server's registry read waits for a time tick under
# writes), so more threads than cores; with 16, SciFact ingestion into Milvus 2.3.5 ran at 250-350
# chunks/s with every thread parked on a registry read, with 64 at 460-480 (docs/benchmarks.md,
# figures behind the code's choices).
STORE_THREADS = 64
SERVICE_NAME = ingest_pb2.DESCRIPTOR.services_by_name["IngestService"].full_name


@dataclass
class IngestComponents:
    pipeline: IngestPipeline
    lifecycle: DocumentLifecycle
    ingestions: Ingestions
    documents: DocumentService
    jobs: IngestJobRunner
    executor: ThreadPoolExecutor
    gate: AdmissionGate
    store_executor: ThreadPoolExecutor
    tracer: Tracer = field(default_factory=NoopTracer)  # stage spans, and the RPC spans of the server
    # spooled uploads' disk writes and hashing, off the event loop and apart from extraction
    spool_executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=2, thread_name_prefix="upload-spool")
    )
    workers: DocumentWorkers | None = None  # the processes that prepare documents (RAGRPC_INGEST_PROCESSES)

    async def stop(self, grace_s: float) -> None:
        """At shutdown: running jobs and ingestions get `grace_s` to finish, the rest is rolled back."""
        await self.jobs.drain(grace_s)
        await self.ingestions.drain(grace_s)
        await self.lifecycle.close()

    def shutdown(self) -> None:
        """Stops the executors without waiting for queued work (recovery finishes it at start), and the
        document workers."""
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.store_executor.shutdown(wait=False, cancel_futures=True)
        self.spool_executor.shutdown(wait=False, cancel_futures=True)
        if self.workers is not None:
            self.workers.close()


def build_components(
    settings: Settings,
    embedder: Embedder,
    chunks: ChunkStore,
    registry: DocumentRegistry,
    metrics: Metrics | None = None,
    lease: WriterLease | None = None,
    tracer: Tracer | None = None,
    settle_delays_s: Sequence[float] | None = None,
) -> IngestComponents:
    """The components; with `lease`, every write to the store first checks that this process still
    holds the writer lease, unexpired (the service's main takes it before recovery)."""
    if lease is not None:
        chunks = FencedChunkStore(chunks, lease)
        registry = FencedRegistry(registry, lease)
    if change_journal_enabled(settings, chunks):
        registry = JournalledRegistry(registry)  # type: ignore[assignment]
    executor = ThreadPoolExecutor(max_workers=max(2, settings.cpu_workers), thread_name_prefix="ingest-cpu")
    # Store calls mostly wait (on the store, on the one writer); enough threads that the writes of
    # many documents queue at once and leave in one group-committed call, and that a slow store
    # call never holds up extraction.
    store_executor = ThreadPoolExecutor(max_workers=STORE_THREADS, thread_name_prefix="ingest-store")
    # the planner plans with the whole window: a context header gets what each chunk leaves free
    counter = embedder.token_counter()  # thread-safe; one for the planner and the context headers
    planner = ChunkPlannerImpl(
        counter,
        embedder.max_tokens,
        default_size=settings.chunk_size_tokens,
        default_overlap=settings.chunk_overlap_tokens,
        max_chunks_per_document=settings.max_chunks_per_document,
        embed=embedder.embed_documents,
    )
    workers = document_workers(settings, counter, embedder.max_tokens, getattr(chunks, "stores_analysed_terms", False))
    batcher = EmbeddingBatcher(
        embedder.embed_documents,
        batch_size=settings.embedding_call_size,
        concurrency=embedder.streams,
    )
    tracer = tracer if tracer is not None else tracer_from_setting(settings.tracing)
    lifecycle = DocumentLifecycle(
        registry,
        chunks,
        store_executor,
        may_write=lease.check if lease is not None else lambda: None,
        replaced_grace_s=settings.replaced_version_grace_s,
        **({"settle_delays_s": settle_delays_s} if settle_delays_s is not None else {}),
    )
    pipeline = IngestPipeline(
        extractor=build_default_registry(ExtractionLimits()),
        planner=planner,
        embedder=embedder,
        batcher=batcher,
        chunks=chunks,
        lifecycle=lifecycle,
        executor=executor,
        embed_batch_size=settings.embedding_call_size,
        document_timeout_s=settings.document_timeout_s,
        clean=clean_document,
        observer=IngestMetricsObserver(metrics) if metrics else None,
        memory=ByteBudget(settings.extraction_memory_bytes),
        tracer=tracer,
        context_headers=settings.context_headers,
        header_counter=counter,
        enrichers=build_enrichers(
            settings.enrichers,
            on_failure=(lambda name: metrics.enricher_failures.labels(name).inc()) if metrics else None,
        ),
        workers=workers,
    )
    ingestions = Ingestions(pipeline, concurrency=settings.ingest_concurrency)
    documents = DocumentService(registry, lifecycle)
    gate = AdmissionGate(settings.max_pending_documents)
    if metrics is not None:
        metrics.ingest_queue_depth.set_function(lambda: gate.pending)
    jobs = IngestJobRunner(ingestions, registry, executor, gate)
    return IngestComponents(
        pipeline, lifecycle, ingestions, documents, jobs, executor, gate, store_executor, tracer=tracer, workers=workers
    )


def document_workers(
    settings: Settings, counter: TokenCounter, window: int, bm25_terms: bool
) -> DocumentWorkers | None:
    """The worker processes that prepare documents (RAGRPC_INGEST_PROCESSES; None for -1), each with a
    preparer built from the same settings and token counter, logging as the service does; with
    `bm25_terms` (a store that keeps each chunk's analysed terms) they analyse them too. They start
    with the first document, or at `start_document_workers`."""
    processes = settings.document_worker_processes
    if processes == 0:
        return None
    return DocumentWorkers(
        functools.partial(build_preparer, settings, counter, window, bm25_terms=bm25_terms),
        processes,
        setup=functools.partial(configure_logging, settings.log_level, "ingest", settings.log_format),
    )


async def start_document_workers(components: IngestComponents) -> None:
    """Starts the document workers before the service serves, so the first documents do not wait for them."""
    if components.workers is not None:
        await asyncio.to_thread(components.workers.start)


async def start_ingest_server(
    settings: Settings, components: IngestComponents, address: str | None = None, metrics: Metrics | None = None
) -> RunningServer:
    servicer = IngestServicer(
        ingestions=components.ingestions,
        documents=components.documents,
        jobs=components.jobs,
        gate=components.gate,
        executor=components.executor,
        max_upload_bytes=settings.max_upload_bytes,
        max_batch_documents=settings.max_batch_documents,
        upload_memory_bytes=settings.upload_memory_bytes,
        spool_directory=settings.upload_spool_dir or None,
        spool_executor=components.spool_executor,
    )
    registration = ServiceRegistration(
        SERVICE_NAME, lambda server: ingest_pb2_grpc.add_IngestServiceServicer_to_server(servicer, server)
    )
    return await host_service(
        settings,
        registration,
        address=address or f"{settings.host}:{settings.ingest_port}",
        call_timeout_s=settings.ingest_call_timeout_s,
        extra_interceptors=[MetricsInterceptor(metrics)] if metrics else [],
        tracer=components.tracer,
    )


async def run_recovery(components: IngestComponents) -> None:
    counts = await asyncio.get_running_loop().run_in_executor(components.executor, components.lifecycle.recover)
    logger.info("recovery done: %s", counts)
