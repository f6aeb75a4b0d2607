"""Composition root of the query service."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from query_service.answering import AnswerService
from query_service.coarse_partitions import PartitionPolicy
from query_service.consistency import ConsistencyGate
from query_service.context import ContextAssembler
from query_service.dense import InProcessDenseRetriever, StoreDenseRetriever, dense_search_mode
from query_service.dense_index import InProcessDenseIndex
from query_service.generation import build_generator_chain, parse_endpoints
from query_service.index_snapshot import IndexSnapshots
from query_service.index_sync import ChunkIndexSync
from query_service.prompt_templates import PromptBuilder, PromptTemplates
from query_service.registry_follower import RegistryFollower
from query_service.remote_rerank import RemoteRerankConfig, RemoteReranker
from query_service.rerank import CrossEncoderReranker, Reranker
from query_service.retrieval import FollowedVisibility, RetrievalPipeline, SparseRetriever
from query_service.servicer import RetrievalLimits, RetrieveServicer
from query_service.snapshot_builder import SnapshotBuilder
from query_service.sparse import MilvusBm25Retriever, RankBm25Retriever
from query_service.sparse_index import Bm25Parameters, InProcessBm25Index
from ragrpc import deadlines, errors
from ragrpc.analyzer import EnglishAnalyzer
from ragrpc.change_journal import change_journal_enabled
from ragrpc.config import Settings
from ragrpc.embeddings import Embedder
from ragrpc.enrich import build_enrichers
from ragrpc.metrics import AnswerMetricsObserver, Metrics, MetricsInterceptor
from ragrpc.server import RunningServer, ServiceRegistration, host_service
from ragrpc.store.base import ChunkStore, DocumentRegistry
from ragrpc.supervised import SupervisedLoop, watch_health
from ragrpc.tokens import TiktokenCounter
from ragrpc.tracing import NoopTracer, Tracer, tracer_from_setting
from ragrpc.v1 import retrieve_pb2, retrieve_pb2_grpc

logger = logging.getLogger(__name__)

SERVICE_NAME = retrieve_pb2.DESCRIPTOR.services_by_name["RetrieveService"].full_name
PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
_DENSE_SEARCH_THREADS = 16  # in-process dense searches at once: the ones past the running pass share the next


def the_sync(components: QueryComponents) -> ChunkIndexSync:
    """The ChunkIndexSync whose indexes a snapshot holds."""
    return sync_of(components.follower)


def sync_of(follower: RegistryFollower) -> ChunkIndexSync:
    """The follower's ChunkIndexSync (the one whose indexes a snapshot holds)."""
    return next(listener for listener in follower.listeners if isinstance(listener, ChunkIndexSync))


@dataclass
class QueryComponents:
    retrieval: RetrievalPipeline
    answers: AnswerService
    executor: ThreadPoolExecutor
    limits: RetrievalLimits
    follower: RegistryFollower
    background: list[SupervisedLoop] = field(default_factory=list)
    tracer: Tracer = field(default_factory=NoopTracer)  # stage spans, and the RPC spans of the server
    snapshots: IndexSnapshots | None = None  # RAGRPC_INDEX_SNAPSHOT_DIR
    restored: bool = False  # the view was restored from a snapshot (it catches up at start)
    # runs a full load elsewhere and writes the snapshot that a start without one then loads (the service's
    # main sets it: query_service.snapshot_builder, RAGRPC_INDEX_BUILD_IN_CHILD); None: the full load runs here
    snapshot_builder: SnapshotBuilder | None = None

    def start_background(self) -> list[asyncio.Task]:
        """Starts the supervised background loops (following the registry) on the running event loop."""
        return [asyncio.create_task(loop.run(), name=loop.name) for loop in self.background]


def build_sparse(
    settings: Settings,
    chunks: ChunkStore,
    follower: RegistryFollower,
    dense_index: InProcessDenseIndex | None = None,
    bm25: InProcessBm25Index | None = None,
) -> SparseRetriever | None:
    """The configured sparse retriever; rank_bm25's index (`bm25`, e.g. one restored from a snapshot,
    else a new one) becomes a listener of the follower (it is filled when the follower loads). With
    `dense_index`, one sync keeps both indexes (one scan), and without rank_bm25 it keeps the dense
    index alone."""
    backend = settings.sparse_backend.lower()
    if backend not in ("none", "milvus_bm25", "rank_bm25"):
        raise errors.PreconditionError(f"unknown RAGRPC_SPARSE_BACKEND {backend!r}; use milvus_bm25, rank_bm25 or none")
    if backend == "milvus_bm25" and not chunks.supports_bm25:
        raise errors.PreconditionError(
            "RAGRPC_SPARSE_BACKEND=milvus_bm25 but the collection has no BM25 function "
            "(Milvus < 2.5); use rank_bm25 or none"
        )
    if backend != "rank_bm25":
        bm25 = None
    elif bm25 is None:
        bm25 = InProcessBm25Index(EnglishAnalyzer(), bm25_parameters(settings))
    if bm25 is not None or dense_index is not None:
        sync = ChunkIndexSync(bm25, chunks, context_headers=settings.context_headers, dense=dense_index)
        follower.add_listener(sync)
    if backend == "milvus_bm25":
        return MilvusBm25Retriever(chunks)
    return RankBm25Retriever(bm25) if bm25 is not None else None


def bm25_parameters(settings: Settings) -> Bm25Parameters:
    """rank_bm25's k1 and b from the settings (the formula and its epsilon stay rank_bm25's)."""
    k1, b = settings.bm25_k1, settings.bm25_b
    if not (math.isfinite(k1) and k1 >= 0):
        raise errors.PreconditionError(f"RAGRPC_BM25_K1 must be a finite number >= 0, got {k1!r}")
    if not (math.isfinite(b) and 0 <= b <= 1):
        raise errors.PreconditionError(f"RAGRPC_BM25_B must be between 0 and 1, got {b!r}")
    return Bm25Parameters(k1=k1, b=b)


def check_retrieval_settings(settings: Settings) -> None:
    """Refuses (FAILED_PRECONDITION, naming the variable) fusion and BM25 settings no request could use."""
    bm25_parameters(settings)
    if settings.rrf_k < 1:
        raise errors.PreconditionError(f"RAGRPC_RRF_K must be a positive integer, got {settings.rrf_k}")
    weights = (settings.dense_weight, settings.sparse_weight)
    if not all(math.isfinite(w) and w >= 0 for w in weights) or sum(weights) <= 0:
        raise errors.PreconditionError(
            f"RAGRPC_DENSE_WEIGHT and RAGRPC_SPARSE_WEIGHT must be finite, >= 0 and not both 0, got {weights}"
        )


def build_dense_index(settings: Settings, chunks: ChunkStore, dimension: int) -> InProcessDenseIndex | None:
    """The in-process dense index where RAGRPC_DENSE_SEARCH resolves to in_process, else None."""
    mode = dense_search_mode(settings.dense_search, chunks, settings.dense_in_process_max_chunks)
    logger.info("dense search: %s (RAGRPC_DENSE_SEARCH=%s)", mode, settings.dense_search)
    return InProcessDenseIndex(dimension, partitions=partition_policy(settings)) if mode == "in_process" else None


def partition_policy(settings: Settings) -> PartitionPolicy:
    """When held vectors are searched over their coarse partitions (FAILED_PRECONDITION when invalid)."""
    try:
        return PartitionPolicy(
            min_chunks=settings.dense_partitions_min_chunks, probe_percent=settings.dense_partitions_probe_percent
        )
    except ValueError as error:
        raise errors.PreconditionError(
            f"RAGRPC_DENSE_PARTITIONS_MIN_CHUNKS / RAGRPC_DENSE_PARTITIONS_PROBE_PERCENT: {error}"
        ) from error


def load_follower(follower: RegistryFollower) -> None:
    """The complete start-up view: every visible document, then (rank_bm25) every chunk of them."""
    started = time.monotonic()
    documents = follower.load()
    logger.info("registry followed: %d visible documents loaded in %.1fs", documents, time.monotonic() - started)


RERANKER_PROVIDERS = ("auto", "none", "local", "remote")


def reranker_provider(settings: Settings) -> str:
    """none, local or remote: RAGRPC_RERANKER_PROVIDER, with auto resolved (ValueError when invalid)."""
    provider = settings.reranker_provider.strip().lower()
    if provider not in RERANKER_PROVIDERS:
        choices = ", ".join(RERANKER_PROVIDERS)
        raise ValueError(f"RAGRPC_RERANKER_PROVIDER must be one of {choices}, got {settings.reranker_provider!r}")
    if provider == "auto":
        return "remote" if settings.reranker_url.strip() else "local" if settings.reranker_model.strip() else "none"
    if provider == "local" and not settings.reranker_model.strip():
        raise ValueError("RAGRPC_RERANKER_PROVIDER=local needs RAGRPC_RERANKER_MODEL (a cross-encoder)")
    if provider == "remote" and not settings.reranker_url.strip():
        raise ValueError("RAGRPC_RERANKER_PROVIDER=remote needs RAGRPC_RERANKER_URL (the rerank endpoint)")
    return provider


def build_reranker(settings: Settings, metrics: Metrics | None = None) -> Reranker | None:
    """The configured reranker: a remote API (checked, never called at start) or a loaded cross-encoder."""
    provider = reranker_provider(settings)
    if provider == "none":
        return None
    if provider == "remote":
        return RemoteReranker(
            RemoteRerankConfig.from_settings(settings),
            time_left=deadlines.time_left_s,
            on_failure=(lambda cause: metrics.rerank_failures.labels(cause).inc()) if metrics else None,
        )
    reranker = CrossEncoderReranker(settings.reranker_model)
    reranker.warm_up()
    return reranker


def build_components(
    settings: Settings,
    embedder: Embedder,
    chunks: ChunkStore,
    registry: DocumentRegistry,
    *,
    sparse: SparseRetriever | None = None,
    reranker: Reranker | None = None,
    use_configured_sparse: bool = True,
    metrics: Metrics | None = None,
    load: bool = True,
    tracer: Tracer | None = None,
) -> QueryComponents:
    """The query service's components; with load=False the registry follower (and the BM25 index)
    load later, in start_query_server, while the server answers health checks as NOT_SERVING.
    `tracer` defaults to the one RAGRPC_TRACING asks for."""
    check_retrieval_settings(settings)
    if tracer is None:
        tracer = tracer_from_setting(settings.tracing)
    executor = ThreadPoolExecutor(max_workers=max(4, settings.cpu_workers * 2), thread_name_prefix="query-cpu")
    follower = build_follower(settings, chunks, registry)
    dense_index = build_dense_index(settings, chunks, embedder.dimension)
    configured = sparse is None and use_configured_sparse
    keeps_bm25 = configured and settings.sparse_backend.lower() == "rank_bm25"
    snapshots = (
        index_snapshots(settings, embedding_identity(embedder), dense_held=dense_index is not None)
        if configured
        else None
    )
    snapshot = (
        snapshots.load(analyzer=EnglishAnalyzer() if keeps_bm25 else None, dense=dense_index is not None)
        if (snapshots is not None and (keeps_bm25 or dense_index is not None))
        else None
    )
    if snapshot is not None and snapshot.dense is not None:
        dense_index = snapshot.dense
    if configured:
        sparse = build_sparse(settings, chunks, follower, dense_index, bm25=snapshot.bm25 if snapshot else None)
    elif dense_index is not None:  # the sparse retriever was given: a sync for the dense index alone
        follower.add_listener(ChunkIndexSync(None, chunks, context_headers=settings.context_headers, dense=dense_index))
    syncs = [listener for listener in follower.listeners if isinstance(listener, ChunkIndexSync)]
    if snapshot is not None and snapshots is not None and len(syncs) == 1:
        snapshots.restore(snapshot, follower, syncs[0])
    if load:
        load_or_catch_up(follower)
    retrieval = RetrievalPipeline(
        embedder=embedder,
        chunks=chunks,
        dense=InProcessDenseRetriever(dense_index) if dense_index is not None else StoreDenseRetriever(chunks),
        visibility=FollowedVisibility(follower, registry),
        consistency=ConsistencyGate(follower, max_wait_s=settings.consistency_max_wait_s),
        sparse=sparse,
        reranker=reranker,
        executor=executor,
        # in-process dense searches wait for a pass they share (query_service.shared_passes): threads of their own
        dense_executor=(
            ThreadPoolExecutor(max_workers=_DENSE_SEARCH_THREADS, thread_name_prefix="query-dense")
            if dense_index is not None
            else None
        ),
        rerank_top_n=settings.rerank_top_n,
        tracer=tracer,
        query_analyser=build_enrichers(
            settings.enrichers,
            on_failure=(lambda name: metrics.enricher_failures.labels(name).inc()) if metrics else None,
        ),
    )
    counter = TiktokenCounter(settings.tiktoken_encoding)
    prompts = PromptBuilder(
        PromptTemplates(PROMPTS_DIR),
        ContextAssembler(counter),
        counter,
        default_budget=settings.token_budget,
        default_max_answer_tokens=settings.max_answer_tokens,
    )
    chain = build_generator_chain(parse_endpoints(settings.llm_endpoints), counter=counter, tracer=tracer)
    answers = AnswerService(
        retrieval=retrieval,
        prompts=prompts,
        chain=chain,
        executor=executor,
        observer=AnswerMetricsObserver(metrics) if metrics else None,
        tracer=tracer,
    )
    limits = RetrievalLimits(
        max_query_chars=settings.max_query_chars,
        max_top_k=settings.max_top_k,
        max_candidates=settings.max_candidates,
        default_candidates=settings.candidates,
        default_rrf_k=settings.rrf_k,
        default_weights=(settings.dense_weight, settings.sparse_weight),
    )
    if metrics is not None:
        metrics.index_lagging_documents.set_function(lambda: follower.lagging)
    on_failure = (lambda task: metrics.background_failures.labels(task).inc()) if metrics else None
    follow = SupervisedLoop(
        "registry-follow", follower.poll, interval_s=settings.registry_follow_interval_s, on_failure=on_failure
    )
    background = [follow]
    if snapshots is not None and len(syncs) == 1:
        sync = syncs[0]
        background.append(
            SupervisedLoop(
                "index-snapshot",
                lambda: snapshots.save(follower, sync),
                interval_s=settings.index_snapshot_interval_s,
                max_backoff_s=settings.index_snapshot_interval_s,
                on_failure=on_failure,
            )
        )
    components = QueryComponents(retrieval, answers, executor, limits, follower, background, tracer=tracer)
    components.snapshots = snapshots if len(syncs) == 1 else None
    components.restored = snapshot is not None and len(syncs) == 1
    return components


def build_follower(settings: Settings, chunks: ChunkStore, registry: DocumentRegistry) -> RegistryFollower:
    """The registry follower as the settings configure it (its listeners are added by the index builders)."""
    return RegistryFollower(
        registry,
        reconcile_interval_s=settings.registry_reconcile_interval_s,
        sweep_interval_s=settings.registry_sweep_interval_s,
        change_journal=change_journal_enabled(settings, chunks),
        give_up_after_s=settings.index_give_up_after_s,
    )


def embedding_identity(embedder: Embedder) -> tuple[str, str, int]:
    """What of the embedder a snapshot's indexes depend on: provider, model id, dimension."""
    return (embedder.provider, embedder.model_id, embedder.dimension)


def index_snapshots(settings: Settings, embedding: tuple[str, str, int], *, dense_held: bool) -> IndexSnapshots | None:
    """The snapshots of RAGRPC_INDEX_SNAPSHOT_DIR (None when unset), with what their indexes depend on
    (`embedding`: `embedding_identity` of the service's embedder)."""
    if not settings.index_snapshot_dir.strip():
        return None
    identity = {
        "format": "ragrpc-query-indexes/1",
        "milvus_uri": settings.milvus_uri,
        "collection_prefix": settings.collection_prefix,
        "embedding": list(embedding),
        "sparse_backend": settings.sparse_backend.lower(),
        "analyzer": EnglishAnalyzer.__name__,
        "bm25": [settings.bm25_k1, settings.bm25_b],
        "context_headers": settings.context_headers,
        "metadata_filter_keys": settings.metadata_filter_keys,
        "dense_held": dense_held,
    }
    return IndexSnapshots(
        settings.index_snapshot_dir,
        identity=identity,
        max_age_s=settings.index_snapshot_max_age_s,
        dense_options={"partitions": partition_policy(settings)},
    )


def load_or_catch_up(follower: RegistryFollower) -> None:
    """The complete start-up view: restored from a snapshot, a first poll catches up with the registry
    since it (RegistryFollower.restore says when that poll lists every key too); else the full load
    (every visible document, then every chunk of them)."""
    if follower.loaded:
        started = time.monotonic()
        changed = follower.poll()
        logger.info(
            "registry followed from the snapshot: %d changes since it applied in %.1fs (%d visible documents)",
            changed,
            time.monotonic() - started,
            follower.document_count,
        )
        return
    load_follower(follower)


async def load_complete_view(follower: RegistryFollower) -> None:
    """The follower's complete start-up view: a full load unless it was restored from a snapshot (retried
    with backoff while it fails), then polls until every document is complete (a store that returned a
    document's chunks short) and, after a snapshot, until the changes since it are applied."""
    delay = 1.0
    while not follower.loaded:
        try:
            await asyncio.to_thread(load_follower, follower)
            break
        except Exception:  # noqa: BLE001 - the store may not be ready yet; health stays NOT_SERVING
            logger.exception("loading the registry and index failed; retrying in %.0fs", delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)
    delay = 0.2
    while not follower.ready:  # until every document loaded is complete (or given up on)
        try:
            await asyncio.to_thread(follower.poll)
        except Exception:  # noqa: BLE001 - retried; health stays NOT_SERVING
            logger.exception("completing the start-up load failed; retrying")
        if not follower.ready:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


def restore_built_snapshot(components: QueryComponents) -> bool:
    """The snapshot another process just wrote (`snapshot_builder`) becomes this service's view: its
    indexes are adopted by the ones the components were built on, the follower and the sync take its state
    (they catch up from its watermark next). False (logged by the snapshot's load) when it cannot be used:
    the full load then runs here."""
    snapshots = components.snapshots
    assert snapshots is not None
    sync = the_sync(components)
    started = time.monotonic()
    snapshot = snapshots.load(
        analyzer=EnglishAnalyzer() if sync.bm25_index is not None else None, dense=sync.dense_index is not None
    )
    if snapshot is None:
        return False
    if snapshot.bm25 is not None and sync.bm25_index is not None:
        sync.bm25_index.adopt(snapshot.bm25)
    if snapshot.dense is not None and sync.dense_index is not None:
        sync.dense_index.adopt(snapshot.dense)
    snapshots.restore(snapshot, components.follower, sync)
    components.restored = True
    logger.info(
        "the index snapshot the build process wrote is loaded (%.1fs): %s", time.monotonic() - started, snapshot.path
    )
    return True


async def start_query_server(
    settings: Settings,
    components: QueryComponents,
    address: str | None = None,
    metrics: Metrics | None = None,
    after_load: Callable[[], None] | None = None,
) -> RunningServer:
    """Serves `components`; when they were built without loading, loads them in the background
    (NOT_SERVING meanwhile), then runs `after_load` (the service's main freezes the loaded heap),
    then reports SERVING."""
    servicer = RetrieveServicer(retrieval=components.retrieval, answers=components.answers, limits=components.limits)
    registration = ServiceRegistration(
        SERVICE_NAME, lambda server: retrieve_pb2_grpc.add_RetrieveServiceServicer_to_server(servicer, server)
    )
    loaded = components.follower.ready
    running = await host_service(
        settings,
        registration,
        address=address or f"{settings.host}:{settings.query_port}",
        call_timeout_s=settings.query_call_timeout_s,
        extra_interceptors=[MetricsInterceptor(metrics)] if metrics else [],
        serving=loaded,
        tracer=components.tracer,
    )
    running.background_tasks.append(
        asyncio.create_task(
            watch_health(components.background, running, ready=lambda: components.follower.ready), name="health"
        )
    )
    if loaded:
        running.background_tasks += components.start_background()
    else:
        running.background_tasks.append(
            asyncio.create_task(_load_then_serve(components, running, after_load), name="load")
        )
    return running


async def _load_then_serve(
    components: QueryComponents, running: RunningServer, after_load: Callable[[], None] | None = None
) -> None:
    """Loads the complete index while health says NOT_SERVING (and Retrieve/Ask answer UNAVAILABLE):
    from the snapshot that `components.snapshot_builder` writes when there is one (a full load in another
    process), else in full here; applies what the load could not complete (a store that returned a
    document's chunks short) or what changed since the snapshot, runs `after_load`, then reports SERVING
    and starts following the registry. A failed load is retried with backoff."""
    if components.snapshot_builder is not None and components.snapshots is not None and not components.restored:
        if await components.snapshot_builder.build():
            await asyncio.to_thread(restore_built_snapshot, components)
    await load_complete_view(components.follower)
    if components.snapshots is not None and not components.restored:  # the first snapshot, after a full load
        try:
            await asyncio.to_thread(components.snapshots.save, components.follower, the_sync(components))
        except Exception:  # noqa: BLE001 - serving does not depend on it; the snapshot loop tries again
            logger.exception("writing the first index snapshot failed")
    if after_load is not None:
        after_load()
    await running.set_serving()
    running.background_tasks += components.start_background()
    logger.info("query service SERVING")
