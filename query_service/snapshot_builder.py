"""The query service's full load in a child process, which writes the index snapshot the service then
starts from (RAGRPC_INDEX_BUILD_IN_CHILD, with RAGRPC_INDEX_SNAPSHOT_DIR).

Why: a full load (every visible document's chunks read, analysed and indexed) leaves its working heap
with the process that ran it. At 1M chunks a service right after a full load held 2.7 GiB (Milvus 2.3.5)
and 4.9 GiB (milvus-lite), where the same indexes loaded from a snapshot take about 1.1 GiB: the
snapshot's arrays are memory-mapped, and the objects and buffers the load went through are gone. Python
gives little of a grown heap back to the system, so the way to drop it is to let a process end.

So a start that finds no usable snapshot spawns a child (the "spawn" start method: a fresh interpreter,
nothing of the service's gRPC server, channels or threads inherited), which opens the store, runs the
same full load the service would, writes the snapshot and exits. The service meanwhile binds its port,
loads its model and says NOT_SERVING, as it does during any load; once the child is done it loads that
snapshot (its indexes adopt the snapshot's), catches up with the registry from the snapshot's watermark
(changes made during the build are applied there) and says SERVING. A child that fails or cannot be
started, or a snapshot the service then cannot use, costs the full load in the service itself, logged.

The child exits when the service does: it watches its parent (a service killed with SIGKILL leaves no
load behind), and a service that stops during the build terminates it.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import resource
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ragrpc.config import Settings
from ragrpc.store.base import ChunkStore, DocumentRegistry

logger = logging.getLogger(__name__)

EXIT_FAILED = 1  # the load or the snapshot's write failed (logged by the child)
EXIT_ORPHANED = 3  # the service that started the build is gone
_PARENT_POLL_S = 1.0


class SnapshotBuilder(Protocol):
    """Writes a current index snapshot of the collection (a full load somewhere else than the service)."""

    async def build(self) -> bool:
        """True once the snapshot is written; False (logged) when it was not."""
        ...


@dataclass(frozen=True)
class BuildSpec:
    """What the child needs: the service's settings and its embedder's identity (provider, model id,
    dimension: the snapshot's identity and the store's schema check; the child loads no model)."""

    settings: Settings
    embedding: tuple[str, str, int]


class ChildProcessSnapshotBuilder:
    """Runs the full load and the snapshot's write in a spawned child process (`build_in_child`)."""

    def __init__(self, spec: BuildSpec, *, stop_grace_s: float = 5.0) -> None:
        self._spec = spec
        self._stop_grace_s = stop_grace_s

    async def build(self) -> bool:
        context = multiprocessing.get_context("spawn")
        process = context.Process(
            target=build_in_child, args=(self._spec, os.getpid()), name="query-index-build", daemon=True
        )
        started = time.monotonic()
        try:
            await asyncio.to_thread(process.start)
        except Exception:  # noqa: BLE001 - e.g. no memory or process slots left: the load runs here instead
            logger.exception("the index build process could not be started; the full load runs in this process")
            return False
        logger.info(
            "full load in a child process (pid %s): it writes the index snapshot this service then starts from",
            process.pid,
        )
        try:
            await asyncio.to_thread(process.join)
        except asyncio.CancelledError:  # the service stops during the build
            await asyncio.shield(asyncio.to_thread(_stop, process, self._stop_grace_s))
            raise
        seconds = time.monotonic() - started
        if process.exitcode == 0:
            logger.info(
                "the index build process wrote the snapshot in %.1fs (its peak RSS %.0f MiB)",
                seconds,
                _children_peak_mib(),
            )
            return True
        logger.error(
            "the index build process (pid %s) exited with code %s after %.1fs; the full load runs in this process",
            process.pid,
            process.exitcode,
            seconds,
        )
        return False


def _children_peak_mib() -> float:
    """The largest peak RSS of this process's children that have ended (the build process: the service has
    no other child that ends)."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def _stop(process: Any, grace_s: float) -> None:
    process.terminate()
    process.join(grace_s)
    if process.is_alive():
        process.kill()
        process.join(grace_s)


def build_in_child(spec: BuildSpec, parent_pid: int) -> None:
    """The child's entry: the full load as the service would run it, then the snapshot; exit code 0 once
    written, EXIT_FAILED when something failed (logged), EXIT_ORPHANED when the service went away."""
    from ragrpc.logging_setup import configure_logging

    settings = spec.settings
    configure_logging(settings.log_level, "query/index-build", settings.log_format)
    _exit_with(parent_pid)
    try:
        path = asyncio.run(_build(spec))
    except BaseException:  # noqa: BLE001 - reported by the exit code; the service loads in full itself
        logger.exception("the full load for the index snapshot failed")
        sys.exit(EXIT_FAILED)
    logger.info("index snapshot written: %s", path)


async def _build(spec: BuildSpec) -> Path:
    from ragrpc.store.factory import open_milvus_stores

    provider, model_id, dimension = spec.embedding
    stores = await asyncio.to_thread(
        open_milvus_stores,
        spec.settings,
        model_id=model_id,
        dimension=dimension,
        provider=provider,
        writer=False,
        wait_s=120.0,
    )
    return await build_snapshot(spec.settings, stores.chunks, stores.registry, spec.embedding)


async def build_snapshot(
    settings: Settings, chunks: ChunkStore, registry: DocumentRegistry, embedding: tuple[str, str, int]
) -> Path:
    """The full load of the indexes the settings configure, as the service would run it, and the snapshot of
    it, written to RAGRPC_INDEX_SNAPSHOT_DIR (what the child runs, over the stores it opened)."""
    from query_service.app import (
        build_dense_index,
        build_follower,
        build_sparse,
        index_snapshots,
        load_complete_view,
        sync_of,
    )

    follower = build_follower(settings, chunks, registry)
    dense = build_dense_index(settings, chunks, embedding[2])
    build_sparse(settings, chunks, follower, dense)
    snapshots = index_snapshots(settings, embedding, dense_held=dense is not None)
    if snapshots is None:
        raise ValueError("no index snapshot directory (RAGRPC_INDEX_SNAPSHOT_DIR) to write the snapshot to")
    await load_complete_view(follower)
    return await asyncio.to_thread(snapshots.save, follower, sync_of(follower))


def _exit_with(parent_pid: int) -> None:
    """Ends this process when its parent is gone (its parent pid changes when it is re-parented)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(_PARENT_POLL_S)
        logging.getLogger(__name__).error("the query service (pid %d) is gone; the index build stops", parent_pid)
        os._exit(EXIT_ORPHANED)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()
