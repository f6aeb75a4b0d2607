"""python -m query_service: the read-only retrieval and answer gRPC service."""

from __future__ import annotations

import asyncio
import logging
import time

from query_service.app import (
    build_components,
    build_reranker,
    check_retrieval_settings,
    reranker_provider,
    start_query_server,
)
from ragrpc.config import Settings
from ragrpc.embeddings import embedder_from_settings
from ragrpc.logging_setup import configure_logging
from ragrpc.metrics import Metrics, start_metrics_http_server
from ragrpc.server import freeze_startup_heap, run_service_main, serve_until_signalled
from ragrpc.store.factory import open_milvus_stores

logger = logging.getLogger("query_service")


async def main() -> None:
    settings = Settings.from_env()
    configure_logging(settings.log_level, "query", settings.log_format)
    metrics = Metrics()
    if settings.query_metrics_port >= 0:
        bound = start_metrics_http_server(metrics, settings.host, settings.query_metrics_port)
        logger.info("metrics on http://%s:%d/metrics", settings.host, bound)
    check_retrieval_settings(settings)  # a bad setting stops the service before the model and the store open
    if settings.query_embedding_threads < 0:
        raise ValueError(
            f"RAGRPC_QUERY_EMBEDDING_THREADS must be 0 (automatic) or more, got {settings.query_embedding_threads}"
        )
    embedder = embedder_from_settings(settings, threads=settings.query_embedding_threads)
    await asyncio.to_thread(embedder.warm_up)
    stores = await asyncio.to_thread(
        open_milvus_stores,
        settings,
        model_id=embedder.model_id,
        dimension=embedder.dimension,
        provider=embedder.provider,
        writer=False,
        wait_s=120.0,
    )
    reranker = await asyncio.to_thread(build_reranker, settings, metrics)
    components = build_components(
        settings, embedder, stores.chunks, stores.registry, reranker=reranker, metrics=metrics, load=False
    )
    running = await start_query_server(settings, components, metrics=metrics, after_load=_freeze_loaded_heap)
    logger.info(
        "query service listening on %s:%d (store %s, sparse %s, reranker %s); SERVING once its index is loaded",
        settings.host,
        running.port,
        settings.milvus_uri,
        settings.sparse_backend,
        _describe_reranker(settings),
    )
    await serve_until_signalled(running, settings.shutdown_grace_s)
    components.executor.shutdown(wait=False, cancel_futures=True)


def _freeze_loaded_heap() -> None:
    """The model and the loaded index leave the garbage collector's passes (ragrpc.server)."""
    started = time.monotonic()
    frozen = freeze_startup_heap()
    logger.info(
        "loaded heap frozen: %d objects kept out of garbage collection (%.2fs)", frozen, time.monotonic() - started
    )


def _describe_reranker(settings: Settings) -> str:
    provider = reranker_provider(settings)
    if provider == "remote":
        return f"remote {settings.reranker_api} {settings.reranker_url}"
    return settings.reranker_model if provider == "local" else "none"


if __name__ == "__main__":
    run_service_main(main, "query_service")
