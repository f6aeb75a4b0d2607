"""The query service as several processes on one port (RAGRPC_QUERY_PROCESSES > 1): a supervisor
that starts the worker processes, restarts one that dies and stops them all on SIGTERM/SIGINT.

Why processes: the query service's CPU work (query embedding, BM25 scoring, exact dense search,
protobuf) runs Python, so one process uses about one core however many calls it serves; gRPC
Python's answer for CPU-bound servers is one process per core, each its own server on the same
port with SO_REUSEPORT (the kernel hands each new connection to one of them: connections are
spread, not calls, so a caller with one channel talks to one worker).

gRPC and fork: a process that has created a gRPC channel or server must not fork, so the
supervisor never does either (nor opens the store: pymilvus is a gRPC client). It reads the
settings, reserves the port and starts each worker with the "spawn" start method (a fresh
interpreter), which builds the whole service itself.

The workers share the in-memory indexes through the index snapshot (RAGRPC_INDEX_SNAPSHOT_DIR,
required with more than one process): loaded memory-mapped, the snapshot's arrays are the page
cache's pages, one copy on the host however many workers map them. On a first start (no snapshot
yet) worker 0 starts alone, loads the collection in full and writes the snapshot while its health
says NOT_SERVING, and once it is SERVING the others start and load that snapshot; when a snapshot is
there already, all start at once and load it (one that proves unusable, of another model or too old,
costs each worker a full load). A worker other than the first of a group loads before it binds the
port, so connections never land on a worker that is still loading. Each worker follows the registry
itself from the snapshot's watermark, so read-your-writes tokens hold on whichever worker a call
lands. Only worker 0 writes snapshots (periodically and at shutdown); a restarted worker 0 writes
them again.

Lifecycle (logged by the supervisor, each line naming the worker and its pid):

    starting -> SERVING -> (dies) -> restarted after 1, 2, 4 ... 30 s -> SERVING ...
    a worker that exits with code 2 refused to start (a setting, the store): the group stops, exit 2
    more than `max_deaths` deaths within `death_window_s`: the group stops, exit 1
    SIGTERM / SIGINT: forwarded to every worker (each drains its calls within RAGRPC_SHUTDOWN_GRACE_S,
    worker 0 writes its last snapshot), SIGKILL for any still running after twice that; exit 0
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from query_service.index_snapshot import CURRENT
from ragrpc.config import Settings

logger = logging.getLogger("query_service.supervisor")

SERVING = "serving"
EXIT_REFUSED = 2  # run_service_main's exit code for a start-up refusal
MAX_BACKOFF_S = 30.0


@dataclass(frozen=True)
class WorkerRole:
    """What one worker process is: its number among `count`, the port they share, whether it writes
    the index snapshots (worker 0), and whether it binds the port before loading its index (worker 0
    when no other serves: its health then says NOT_SERVING while it loads; every other worker loads
    first, so that no connection lands on it before it can answer)."""

    index: int
    count: int
    port: int
    writes_snapshots: bool
    binds_before_loading: bool

    def settings(self, settings: Settings) -> Settings:
        """The worker's settings: the group's port, its own metrics port (RAGRPC_QUERY_METRICS_PORT + index;
        0 stays 0, a free port, and -1 off), and the group's size (which turns SO_REUSEPORT on)."""
        metrics = settings.query_metrics_port
        return replace(
            settings,
            query_port=self.port,
            query_processes=self.count,
            query_metrics_port=metrics + self.index if metrics > 0 else metrics,
        )

    @property
    def name(self) -> str:
        return f"worker {self.index}"


def process_count(settings: Settings) -> int:
    """RAGRPC_QUERY_PROCESSES with 0 resolved to the cores this process may run on."""
    if settings.query_processes < 0:
        raise ValueError(f"RAGRPC_QUERY_PROCESSES must be 0 (one per core) or more, got {settings.query_processes}")
    return settings.query_processes or _cores()


def _cores() -> int:
    """The cores this process may run on."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)


def check_group_settings(settings: Settings, count: int) -> None:
    """What a group of `count` workers needs beyond one process's settings (ValueError naming the variable)."""
    if not settings.index_snapshot_dir.strip():
        raise ValueError(
            f"RAGRPC_QUERY_PROCESSES={count} needs RAGRPC_INDEX_SNAPSHOT_DIR: the worker processes share their "
            "in-memory indexes through its memory-mapped snapshot (a local directory; about 400 bytes a chunk, "
            "2 KB with held vectors); set it, or run one process"
        )
    metrics = settings.query_metrics_port
    if metrics > 0 and metrics + count - 1 > 65535:
        raise ValueError(
            f"RAGRPC_QUERY_METRICS_PORT={metrics}: worker i serves metrics on it + i, and {metrics + count - 1} "
            "is no port"
        )


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to host:port with SO_REUSEPORT and never listening, held by the supervisor for the
    group's life: port 0 becomes a fixed free port the workers all bind, and while every worker
    restarts no other server (one without SO_REUSEPORT) can take the port. A port already in use is
    refused (OSError naming it): it is first bound without SO_REUSEPORT, so a server already there,
    another group included, is found instead of joined."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    if port:
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.bind(address)
            except OSError as error:
                raise OSError(error.errno, f"RAGRPC_QUERY_PORT {port} on {host} is in use: {error.strerror}") from None
    reserved = socket.socket(family, kind, proto)
    reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        reserved.bind(address)
    except OSError:
        reserved.close()
        raise
    return reserved


@dataclass
class _Slot:
    """One worker's place in the group: its current process and pipe, and its deaths."""

    index: int
    process: Any = None  # multiprocessing.Process (the spawn context's)
    link: Connection | None = None
    serving: bool = False
    stopping: bool = False
    restart_at: float | None = None
    deaths: deque[float] = field(default_factory=deque)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.exitcode is None


class QueryWorkerSupervisor:
    """Runs `count` worker processes of `entry` ("module:function", called in each spawned worker with
    its WorkerRole and a SupervisorLink) on one port until SIGTERM/SIGINT; `run()` returns the exit code."""

    def __init__(
        self,
        settings: Settings,
        count: int,
        entry: str,
        *,
        max_deaths: int = 5,
        death_window_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if count < 2:
            raise ValueError("a worker group has at least 2 processes; run one process without a supervisor")
        self._settings = settings
        self._count = count
        self._entry = entry
        self._max_deaths = max_deaths
        self._death_window_s = death_window_s
        self._clock = clock
        self._context = multiprocessing.get_context("spawn")
        self._slots = [_Slot(i) for i in range(count)]
        self._deaths: deque[float] = deque()
        self._port = 0
        self._group_started = False  # workers 1.. have been started (after worker 0's first SERVING)
        self._all_serving_logged = False
        self._stop_requested = False

    def run(self) -> int:
        settings = self._settings
        reservation = reserve_port(settings.host, settings.query_port)
        self._port = int(reservation.getsockname()[1])
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        previous_wakeup = signal.set_wakeup_fd(wake_write)
        logger.info(
            "query service: %d worker processes on %s:%d (SO_REUSEPORT); worker 0 loads first and writes the index "
            "snapshots in %s",
            self._count,
            settings.host,
            self._port,
            settings.index_snapshot_dir,
        )
        try:
            self._start(0)
            if (Path(settings.index_snapshot_dir) / CURRENT).exists():
                self._start_the_others()  # they load the snapshot there while worker 0 does
            return self._supervise(wake_read)
        finally:
            signal.set_wakeup_fd(previous_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(wake_read)
            os.close(wake_write)
            reservation.close()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._stop_requested = True

    def _supervise(self, wake_read: int) -> int:
        while True:
            if self._stop_requested:
                logger.info("query service: stopping %d workers (signal)", sum(s.alive for s in self._slots))
                self._stop_all()
                return 0
            waitables: list[Any] = [wake_read]
            for slot in self._slots:
                if slot.alive:
                    waitables += [slot.link, slot.process.sentinel]
            ready = wait(waitables, timeout=self._next_restart_in())
            if wake_read in ready:
                try:
                    os.read(wake_read, 512)
                except BlockingIOError:
                    pass
            for slot in self._slots:
                if slot.link is not None and slot.link in ready:
                    self._receive(slot)
            for slot in self._slots:
                if slot.process is not None and slot.process.sentinel in ready and not slot.stopping:
                    code = self._on_exit(slot)
                    if code is not None:
                        self._stop_all()
                        return code
            self._restart_due()

    # --- workers ---------------------------------------------------------------------------------

    def _start(self, index: int) -> None:
        slot = self._slots[index]
        others_serving = any(s.serving and s.alive for s in self._slots if s.index != index)
        role = WorkerRole(
            index=index,
            count=self._count,
            port=self._port,
            writes_snapshots=index == 0,
            binds_before_loading=index == 0 and not others_serving,
        )
        ours, theirs = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=run_worker, args=(self._entry, role, theirs), name=f"query-{role.name}", daemon=False
        )
        process.start()
        theirs.close()
        slot.process, slot.link, slot.serving, slot.restart_at = process, ours, False, None
        logger.info(
            "query %s (pid %d) starting%s%s",
            role.name,
            process.pid,
            " (writes the index snapshots)" if role.writes_snapshots else "",
            "" if role.binds_before_loading else " (loads the snapshot, then binds the port)",
        )

    def _receive(self, slot: _Slot) -> None:
        assert slot.link is not None
        try:
            message = slot.link.recv()
        except (EOFError, OSError):
            return  # the worker is gone; its sentinel says so
        if message and message[0] == SERVING:
            slot.serving = True
            slot.deaths.clear()
            logger.info("query worker %d (pid %d) SERVING on port %d", slot.index, slot.process.pid, self._port)
            if slot.index == 0 and not self._group_started:
                self._start_the_others()
            if not self._all_serving_logged and all(s.serving for s in self._slots):
                self._all_serving_logged = True
                logger.info("query service: all %d workers SERVING on port %d", self._count, self._port)

    def _start_the_others(self) -> None:
        self._group_started = True
        for index in range(1, self._count):
            self._start(index)

    def _on_exit(self, slot: _Slot) -> int | None:
        """A worker exited on its own: an exit code for the group when it must stop, else None (restart)."""
        slot.process.join()
        code = slot.process.exitcode
        pid = slot.process.pid
        self._close_link(slot)
        slot.serving = False
        if code == EXIT_REFUSED:
            logger.error(
                "query worker %d (pid %d) refused to start (exit %d: a setting or the store; its log above says "
                "why); stopping the group",
                slot.index,
                pid,
                code,
            )
            return EXIT_REFUSED
        now = self._clock()
        self._deaths.append(now)
        while self._deaths and now - self._deaths[0] > self._death_window_s:
            self._deaths.popleft()
        if len(self._deaths) > self._max_deaths:
            logger.error(
                "query worker %d (pid %d) exited with %s: %d worker deaths within %.0fs; stopping the group",
                slot.index,
                pid,
                code,
                len(self._deaths),
                self._death_window_s,
            )
            return 1
        slot.deaths.append(now)
        delay = min(MAX_BACKOFF_S, 2.0 ** (len(slot.deaths) - 1))
        slot.restart_at = now + delay
        logger.warning(
            "query worker %d (pid %d) exited with %s; restarting it in %.0fs (%d deaths of at most %d within %.0fs)",
            slot.index,
            pid,
            code,
            delay,
            len(self._deaths),
            self._max_deaths,
            self._death_window_s,
        )
        return None

    def _next_restart_in(self) -> float | None:
        due = [s.restart_at for s in self._slots if s.restart_at is not None]
        return max(0.0, min(due) - self._clock()) if due else None

    def _restart_due(self) -> None:
        now = self._clock()
        for slot in self._slots:
            if slot.restart_at is not None and slot.restart_at <= now:
                if slot.index != 0 and not self._group_started:
                    continue  # started once worker 0 serves
                self._start(slot.index)

    def _stop_all(self) -> None:
        """SIGTERM to every worker; SIGKILL to those still running after twice the shutdown grace (+10 s:
        worker 0 writes its last snapshot within the grace after draining its calls)."""
        live = [slot for slot in self._slots if slot.alive]
        for slot in live:
            slot.stopping = True
            try:
                os.kill(slot.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = self._clock() + 2 * self._settings.shutdown_grace_s + 10.0
        for slot in live:
            slot.process.join(max(0.0, deadline - self._clock()))
            if slot.process.exitcode is None:
                logger.error("query worker %d (pid %d) did not stop in time; killing it", slot.index, slot.process.pid)
                slot.process.kill()
                slot.process.join(10)
            else:
                pid, code = slot.process.pid, slot.process.exitcode
                logger.info("query worker %d (pid %d) stopped (%s)", slot.index, pid, code)
            self._close_link(slot)
        for slot in self._slots:
            slot.restart_at = None

    @staticmethod
    def _close_link(slot: _Slot) -> None:
        if slot.link is not None:
            slot.link.close()
            slot.link = None


# --- the worker's side ---------------------------------------------------------------------------


class SupervisorLink:
    """A worker's pipe to its supervisor: it reports SERVING through it, and when the supervisor is gone
    (the pipe closes: killed, crashed) the worker stops itself gracefully (SIGTERM to itself) instead of
    serving on as an orphan nobody restarts or stops."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, name="supervisor-watch", daemon=True).start()

    def serving(self) -> None:
        with self._lock:
            try:
                self._connection.send((SERVING, os.getpid()))
            except OSError:
                pass  # the supervisor is gone; the watch stops this worker

    def _watch(self) -> None:
        try:
            while True:
                self._connection.recv()
        except (EOFError, OSError):
            logger.error("the query service's supervisor is gone; this worker stops")
            os.kill(os.getpid(), signal.SIGTERM)


def run_worker(entry: str, role: WorkerRole, connection: Connection) -> None:
    """The spawned worker's body: `entry` ("module:function") called with its role and link."""
    module, _, name = entry.partition(":")
    serve = getattr(importlib.import_module(module), name)
    serve(role, SupervisorLink(connection))
