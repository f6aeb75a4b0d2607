"""python -m ingest_service: the ingest gRPC service (sole writer of the collection)."""

from __future__ import annotations

import asyncio
import logging

from ingest_service.app import build_components, run_recovery, start_ingest_server
from ragrpc.config import Settings
from ragrpc.embeddings import embedder_from_settings
from ragrpc.logging_setup import configure_logging
from ragrpc.metrics import Metrics, start_metrics_http_server
from ragrpc.server import run_service_main, serve_until_signalled
from ragrpc.store.factory import open_milvus_stores, wal_flusher
from ragrpc.store.wal_flusher import supervised_flusher

logger = logging.getLogger("ingest_service")


async def main() -> None:
    settings = Settings.from_env()
    configure_logging(settings.log_level, "ingest", settings.log_format)
    metrics = Metrics()
    if settings.ingest_metrics_port >= 0:
        bound = start_metrics_http_server(metrics, settings.host, settings.ingest_metrics_port)
        logger.info("metrics on http://%s:%d/metrics", settings.host, bound)
    embedder = embedder_from_settings(settings, streams=settings.embedding_streams)
    await asyncio.to_thread(embedder.warm_up)
    stores = await asyncio.to_thread(
        open_milvus_stores,
        settings,
        model_id=embedder.model_id,
        dimension=embedder.dimension,
        provider=embedder.provider,
        writer=True,
    )
    components = build_components(settings, embedder, stores.chunks, stores.registry, metrics)
    flusher = wal_flusher(settings, stores)
    flushing = asyncio.create_task(supervised_flusher(flusher, metrics).run()) if flusher is not None else None
    if flusher is not None:
        logger.info("flushing written collections after %.1fs without writes", settings.milvus_flush_idle_s)
    await run_recovery(components)
    running = await start_ingest_server(settings, components, metrics=metrics)
    logger.info(
        "ingest service ready on %s:%d (store %s, model %s, %s provider, %d dimensions)",
        settings.host,
        running.port,
        settings.milvus_uri,
        embedder.model_id,
        embedder.provider,
        embedder.dimension,
    )

    async def on_stop() -> None:
        await components.stop(settings.shutdown_grace_s)
        if flushing is not None and flusher is not None:
            flushing.cancel()
            await asyncio.to_thread(flusher.flush_if_due, force=True)

    await serve_until_signalled(running, settings.shutdown_grace_s, on_stop=on_stop)
    components.shutdown()


if __name__ == "__main__":
    run_service_main(main, "ingest_service")
