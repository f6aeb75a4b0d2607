"""Composition root of the query service."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from query_service.analyzer import EnglishAnalyzer
from query_service.answering import AnswerService
from query_service.context import ContextAssembler
from query_service.generation import build_generator_chain, parse_endpoints
from query_service.prompt_templates import PromptBuilder, PromptTemplates
from query_service.rerank import CrossEncoderReranker, Reranker
from query_service.retrieval import RetrievalPipeline, SparseRetriever
from query_service.servicer import RetrievalLimits, RetrieveServicer
from query_service.sparse import MilvusBm25Retriever, RankBm25Retriever
from query_service.sparse_index import InProcessBm25Index
from query_service.sparse_sync import SparseIndexSync
from ragrpc import errors
from ragrpc.config import Settings
from ragrpc.embeddings import Embedder
from ragrpc.metrics import Metrics, MetricsInterceptor
from ragrpc.observers import AnswerMetricsObserver
from ragrpc.server import RunningServer, ServiceRegistration, host_service
from ragrpc.store.base import ChunkStore, DocumentRegistry
from ragrpc.tokens import TiktokenCounter
from ragrpc.v1 import retrieve_pb2, retrieve_pb2_grpc

logger = logging.getLogger(__name__)

SERVICE_NAME = retrieve_pb2.DESCRIPTOR.services_by_name["RetrieveService"].full_name
PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"


@dataclass
class QueryComponents:
    retrieval: RetrievalPipeline
    answers: AnswerService
    executor: ThreadPoolExecutor
    limits: RetrievalLimits


def build_sparse(settings: Settings, chunks: ChunkStore, registry: DocumentRegistry) -> SparseRetriever | None:
    backend = settings.sparse_backend.lower()
    if backend == "none":
        return None
    if backend == "milvus_bm25":
        if not chunks.supports_bm25:
            raise errors.PreconditionError(
                "RAGRPC_SPARSE_BACKEND=milvus_bm25 but the collection has no BM25 function "
                "(Milvus < 2.5); use rank_bm25 or none"
            )
        return MilvusBm25Retriever(chunks)
    if backend == "rank_bm25":
        index = InProcessBm25Index(EnglishAnalyzer())
        sync = SparseIndexSync(index, registry, chunks)
        loaded = sync.load_all()
        logger.info("rank_bm25 index loaded: %d chunks of %d documents", loaded, sync.indexed_documents)
        return RankBm25Retriever(index, sync)
    raise errors.PreconditionError(f"unknown RAGRPC_SPARSE_BACKEND {backend!r}; use milvus_bm25, rank_bm25 or none")


def build_reranker(settings: Settings) -> Reranker | None:
    if not settings.reranker_model:
        return None
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
) -> QueryComponents:
    executor = ThreadPoolExecutor(max_workers=max(4, settings.cpu_workers * 2), thread_name_prefix="query-cpu")
    if sparse is None and use_configured_sparse:
        sparse = build_sparse(settings, chunks, registry)
    retrieval = RetrievalPipeline(
        embedder=embedder,
        chunks=chunks,
        registry=registry,
        sparse=sparse,
        reranker=reranker,
        executor=executor,
        rerank_top_n=settings.rerank_top_n,
    )
    counter = TiktokenCounter(settings.tiktoken_encoding)
    prompts = PromptBuilder(
        PromptTemplates(PROMPTS_DIR),
        ContextAssembler(counter),
        counter,
        default_budget=settings.token_budget,
        default_max_answer_tokens=settings.max_answer_tokens,
    )
    chain = build_generator_chain(parse_endpoints(settings.llm_endpoints), counter=counter)
    answers = AnswerService(
        retrieval=retrieval,
        prompts=prompts,
        chain=chain,
        executor=executor,
        observer=AnswerMetricsObserver(metrics) if metrics else None,
    )
    limits = RetrievalLimits(
        max_query_chars=settings.max_query_chars,
        max_top_k=settings.max_top_k,
        max_candidates=settings.max_candidates,
        default_candidates=settings.candidates,
    )
    return QueryComponents(retrieval, answers, executor, limits)


async def start_query_server(
    settings: Settings, components: QueryComponents, address: str | None = None, metrics: Metrics | None = None
) -> RunningServer:
    servicer = RetrieveServicer(retrieval=components.retrieval, answers=components.answers, limits=components.limits)
    registration = ServiceRegistration(
        SERVICE_NAME, lambda server: retrieve_pb2_grpc.add_RetrieveServiceServicer_to_server(servicer, server)
    )
    return await host_service(
        settings,
        registration,
        address=address or f"{settings.host}:{settings.query_port}",
        call_timeout_s=settings.query_call_timeout_s,
        extra_interceptors=[MetricsInterceptor(metrics)] if metrics else [],
    )
