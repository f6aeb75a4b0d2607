"""python -m ingest_service: the ingest gRPC service (sole writer of the collection)."""

from __future__ import annotations

import asyncio
import logging

from ingest_service.app import build_components, run_recovery, start_document_workers, start_ingest_server
from ingest_service.writer_lease import WriterLease, keep_renewed
from ragrpc.config import Settings
from ragrpc.embeddings import embedder_from_settings
from ragrpc.logging_setup import configure_logging
from ragrpc.metrics import Metrics, start_metrics_http_server
from ragrpc.server import RunningServer, freeze_startup_heap, run_service_main, serve_until_signalled
from ragrpc.store.factory import open_milvus_stores, read_own_registry_writes, wal_flusher
from ragrpc.store.wal_flusher import supervised_flusher
from ragrpc.supervised import SupervisedLoop, watch_health

logger = logging.getLogger("ingest_service")


def lease_renewal(lease: WriterLease, metrics: Metrics) -> SupervisedLoop:
    """Renews the writer lease (supervised: a store outage is retried within the ttl)."""
    return SupervisedLoop(
        "writer-lease",
        lease.renew,
        interval_s=lease.ttl_s / 3,
        max_backoff_s=lease.ttl_s / 3,
        on_failure=lambda task: metrics.background_failures.labels(task).inc(),
    )


async def keep_lease(lease: WriterLease, renewal: SupervisedLoop, running: RunningServer) -> None:
    """Renews the lease until it is lost (at each interval, and at once when a write was refused for
    want of a renewal); then health turns NOT_SERVING for good (the lifecycle refuses every write
    from then on)."""
    await keep_renewed(lease, renewal)
    await running.set_not_serving()


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
    lease = WriterLease(stores.registry, ttl_s=settings.writer_lease_ttl_s)
    await asyncio.to_thread(lease.acquire)  # before recovery: a second writer must not roll back the first's work
    components = build_components(settings, embedder, stores.chunks, stores.registry, metrics, lease=lease)
    flusher = wal_flusher(settings, stores)
    flush_loop = supervised_flusher(flusher, metrics) if flusher is not None else None
    flushing = asyncio.create_task(flush_loop.run()) if flush_loop is not None else None
    if flusher is not None:
        logger.info("flushing written collections after %.1fs without writes", settings.milvus_flush_idle_s)
    await run_recovery(components)
    read_own_registry_writes(stores)
    await start_document_workers(components)
    logger.info("start-up heap frozen: %d objects kept out of garbage collection", freeze_startup_heap())
    running = await start_ingest_server(settings, components, metrics=metrics)
    renewal = lease_renewal(lease, metrics)
    running.background_tasks.append(asyncio.create_task(keep_lease(lease, renewal, running)))
    loops = [renewal] + ([flush_loop] if flush_loop is not None else [])
    ready = lambda: not lease.lost_reason  # noqa: E731
    running.background_tasks.append(asyncio.create_task(watch_health(loops, running, ready=ready)))
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
        await asyncio.to_thread(lease.release)
        if flushing is not None and flusher is not None:
            flushing.cancel()
            await asyncio.to_thread(flusher.flush_if_due, force=True)

    await serve_until_signalled(running, settings.shutdown_grace_s, on_stop=on_stop)
    components.shutdown()


if __name__ == "__main__":
    run_service_main(main, "ingest_service")
