"""python -m query_service: the read-only retrieval and answer gRPC service.

One process by default; with RAGRPC_QUERY_PROCESSES > 1 (0: one per core) this process becomes the
supervisor of that many worker processes serving the same port (query_service.worker_supervisor),
each of which runs `main` below as a worker."""

from __future__ import annotations

import os

# numpy's BLAS (OpenBLAS) in one thread per process unless set, before numpy loads: its exact dense search
# reads memory one pass at a time (query_service.shared_passes), where a second BLAS thread gave a lone
# Retrieve no speed and spun on the core the other calls need (docs/benchmarks.md, "Figures behind the
# code's choices"). Worker processes inherit it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import asyncio
import dataclasses
import functools
import logging
import sys
import time

from query_service.app import (
    QueryComponents,
    build_components,
    build_reranker,
    check_retrieval_settings,
    embedding_identity,
    load_or_catch_up,
    reranker_provider,
    start_query_server,
    the_sync,
)
from query_service.snapshot_builder import BuildSpec, ChildProcessSnapshotBuilder
from query_service.worker_supervisor import (
    QueryWorkerSupervisor,
    SupervisorLink,
    WorkerRole,
    check_group_settings,
    process_count,
)
from ragrpc.config import Settings
from ragrpc.embeddings import embedder_from_settings
from ragrpc.logging_setup import configure_logging
from ragrpc.metrics import Metrics, start_metrics_http_server
from ragrpc.server import freeze_startup_heap, run_service_main, serve_until_signalled
from ragrpc.store.factory import open_milvus_stores

logger = logging.getLogger("query_service")


async def main(role: WorkerRole | None = None, link: SupervisorLink | None = None) -> None:
    """The service; as a worker of a group (`role`), with the group's port and its own metrics port, it
    writes index snapshots only when its role says so, binds the port only once its index is loaded
    unless it is the first of the group, and reports SERVING to the supervisor through `link`."""
    settings = Settings.from_env()
    settings = role.settings(settings) if role is not None else dataclasses.replace(settings, query_processes=1)
    configure_logging(settings.log_level, "query" if role is None else f"query/{role.index}", settings.log_format)
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
    if role is not None and not role.writes_snapshots:
        _leave_snapshots_to_the_writer(components)
    if settings.index_build_in_child and components.snapshots is not None:
        components.snapshot_builder = ChildProcessSnapshotBuilder(BuildSpec(settings, embedding_identity(embedder)))
    if role is not None and not role.binds_before_loading:
        await asyncio.to_thread(_load_before_binding, components)
    loaded_before = components.follower.ready

    def after_load() -> None:
        _freeze_loaded_heap()
        if link is not None:
            link.serving()

    running = await start_query_server(settings, components, metrics=metrics, after_load=after_load)
    if loaded_before and link is not None:
        link.serving()
    logger.info(
        "query service listening on %s:%d (store %s, sparse %s, reranker %s); SERVING once its index is loaded",
        settings.host,
        running.port,
        settings.milvus_uri,
        settings.sparse_backend,
        _describe_reranker(settings),
    )

    async def on_stop() -> None:
        """A last snapshot, so that the next start (a rolling deploy) catches up from now."""
        if components.snapshots is not None and components.follower.ready:
            try:
                await asyncio.wait_for(
                    asyncio.to_thread(components.snapshots.save, components.follower, the_sync(components)),
                    timeout=settings.shutdown_grace_s,
                )
            except Exception:  # noqa: BLE001 - the previous snapshot stays current
                logger.exception("the index snapshot at shutdown was not written")

    await serve_until_signalled(running, settings.shutdown_grace_s, on_stop=on_stop)
    components.executor.shutdown(wait=False, cancel_futures=True)


def _leave_snapshots_to_the_writer(components: QueryComponents) -> None:
    """A worker other than the snapshot writer reads the snapshot and never writes one (N workers would
    write N copies of the same view): no periodic snapshot loop, none after a load or at shutdown."""
    components.snapshots = None
    components.background = [loop for loop in components.background if loop.name != "index-snapshot"]


def _load_before_binding(components: QueryComponents) -> None:
    """The complete view before the worker binds the port it shares (from the snapshot and the changes
    since, else in full); the writer then writes a snapshot after a full load, as a first start does.
    A view that is not complete yet (a document whose chunks the store returned short) is completed by
    start_query_server's load, NOT_SERVING meanwhile."""
    started = time.monotonic()
    load_or_catch_up(components.follower)
    logger.info("index loaded before binding the port in %.1fs", time.monotonic() - started)
    if components.follower.ready:
        if components.snapshots is not None and not components.restored:
            try:
                components.snapshots.save(components.follower, the_sync(components))
            except Exception:  # noqa: BLE001 - serving does not depend on it; the snapshot loop tries again
                logger.exception("writing the index snapshot after the load failed")
        _freeze_loaded_heap()


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


def serve_as_worker(role: WorkerRole, link: SupervisorLink) -> None:
    """A spawned worker process's entry (QueryWorkerSupervisor's `entry`)."""
    run_service_main(functools.partial(main, role, link), f"query_service worker {role.index}")


def run() -> None:
    """One process, or the supervisor of RAGRPC_QUERY_PROCESSES workers. The supervisor opens neither the
    store nor any gRPC channel or server (its workers are spawned, fresh interpreters, and build all of it)."""
    try:
        settings = Settings.from_env()
        count = process_count(settings)
        if count > 1:
            check_group_settings(settings, count)
    except ValueError as error:
        configure_logging("INFO", "query")
        logger.error("query_service cannot start: INVALID_ARGUMENT: %s", error)
        sys.exit(2)
    if count == 1:
        run_service_main(main, "query_service")
        return
    configure_logging(settings.log_level, "query", settings.log_format)
    try:
        code = QueryWorkerSupervisor(
            dataclasses.replace(settings, query_processes=count), count, "query_service.__main__:serve_as_worker"
        ).run()
    except OSError as error:
        logger.error("query_service cannot start: %s", error)
        code = 2
    sys.exit(code)


if __name__ == "__main__":
    run()
