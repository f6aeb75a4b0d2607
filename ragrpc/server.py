"""Builds a grpc.aio server with health checking, reflection, error mapping, message-size
limits and graceful shutdown on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ragrpc import errors
from ragrpc.grpc_errors import ErrorMappingInterceptor
from ragrpc.tracing import Tracer, tracer_from_setting

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceRegistration:
    """One service to host: its full name and a function that adds its servicer."""

    full_name: str  # e.g. "ragrpc.v1.IngestService"
    add_to_server: Callable[[grpc.aio.Server], None]


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    service_names: tuple[str, ...]
    background_tasks: list[asyncio.Task] = field(default_factory=list)  # cancelled by stop()

    async def set_serving(self) -> None:
        for name in ("", *self.service_names):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def set_not_serving(self) -> None:
        for name in ("", *self.service_names):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def stop(self, grace_s: float) -> None:
        """Marks every service NOT_SERVING, then lets in-flight calls finish for grace_s."""
        await self.health.enter_graceful_shutdown()
        for task in self.background_tasks:
            task.cancel()
        await self.server.stop(grace_s)
        await asyncio.gather(*self.background_tasks, return_exceptions=True)


QUERY_SERVICE = "ragrpc.v1.RetrieveService"


def server_options(max_message_bytes: int, *, reuse_port: bool = False) -> list[tuple[str, Any]]:
    """The servers' channel options. SO_REUSEPORT is off unless asked for: a second server started on a
    port in use then fails to bind instead of silently taking a share of its connections; the query
    service's worker processes ask for it to serve one port together (query_service.worker_supervisor)."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.so_reuseport", 1 if reuse_port else 0),
    ]


async def build_server(
    services: Sequence[ServiceRegistration],
    *,
    address: str,
    max_message_bytes: int,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    credentials: grpc.ServerCredentials | None = None,
    max_concurrent_rpcs: int | None = None,
    tracing_interceptor: grpc.aio.ServerInterceptor | None = None,
    reuse_port: bool = False,
) -> RunningServer:
    """Creates and starts the server on `address` ("host:port", port 0 picks a free one); with
    `reuse_port`, other processes of the same user may serve the same port (SO_REUSEPORT).

    Health starts NOT_SERVING for every service; call `set_serving()` once warm. Calls beyond
    max_concurrent_rpcs are refused with RESOURCE_EXHAUSTED (load shedding). The tracing
    interceptor (the RPC span, see ragrpc.tracing) goes first, so the status the error mapping
    aborts with is recorded on the span.
    """
    tracing = [tracing_interceptor] if tracing_interceptor is not None else []
    server = grpc.aio.server(
        interceptors=[*tracing, ErrorMappingInterceptor(), *interceptors],  # then errors, outside the rest
        options=server_options(max_message_bytes, reuse_port=reuse_port),
        maximum_concurrent_rpcs=max_concurrent_rpcs,
    )
    for service in services:
        service.add_to_server(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = tuple(s.full_name for s in services)
    reflection.enable_server_reflection(
        (*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server
    )
    if credentials is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, credentials)
    if port == 0:
        raise RuntimeError(f"could not bind {address}")
    for name in ("", *names):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    await server.start()
    logger.info("listening on %s (port %d) for %s", address, port, ", ".join(names))
    return RunningServer(server=server, port=port, health=health_servicer, service_names=names)


async def serve_until_signalled(
    running: RunningServer, grace_s: float, on_stop: Callable[[], Any] | None = None
) -> None:
    """Waits for SIGTERM/SIGINT, then shuts down gracefully."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    waiter = asyncio.create_task(running.server.wait_for_termination())
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    logger.info("shutting down (grace %.1fs)", grace_s)
    await running.stop(grace_s)
    if on_stop is not None:
        result = on_stop()
        if asyncio.iscoroutine(result):
            await result
    waiter.cancel()
    stopper.cancel()


async def host_service(
    settings: Any,
    registration: ServiceRegistration,
    *,
    address: str,
    call_timeout_s: float,
    extra_interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    serving: bool = True,
    tracer: Tracer | None = None,
    reuse_port: bool | None = None,
) -> RunningServer:
    """Starts one ragrpc service with the house defaults: TLS/plaintext rule, tenant resolution
    (API keys or a fixed tenant), a server-side deadline, load shedding, then SERVING (with
    serving=False it stays NOT_SERVING until the caller's `set_serving()`). RPC spans come from
    `tracer` (the one the service's components record stage spans with), else from
    settings.tracing (RAGRPC_TRACING). `reuse_port` (SO_REUSEPORT) defaults to what the settings
    say: on for the query service when it runs as several processes (RAGRPC_QUERY_PROCESSES other
    than 1), off otherwise."""
    from ragrpc.deadlines import DeadlineInterceptor
    from ragrpc.request_context import RequestContextInterceptor
    from ragrpc.security import server_credentials, tenant_resolver

    if tracer is None:
        tracer = tracer_from_setting(settings.tracing)
    running = await build_server(
        [registration],
        address=address,
        max_message_bytes=settings.max_message_bytes,
        interceptors=[
            *extra_interceptors,
            RequestContextInterceptor(tenant_resolver(settings)),
            DeadlineInterceptor(call_timeout_s),
        ],
        credentials=server_credentials(settings),
        max_concurrent_rpcs=settings.max_concurrent_rpcs,
        tracing_interceptor=tracer.server_interceptor(),
        reuse_port=shares_port(settings, registration.full_name) if reuse_port is None else reuse_port,
    )
    if serving:
        await running.set_serving()
    return running


def shares_port(settings: Any, service_name: str) -> bool:
    """Whether the service's server joins its port's SO_REUSEPORT group: the query service's worker
    processes do (RAGRPC_QUERY_PROCESSES other than 1); every other server binds its port alone."""
    return service_name == QUERY_SERVICE and getattr(settings, "query_processes", 1) != 1


YOUNG_COLLECTION_THRESHOLD = 10_000  # allocations between two collections of the youngest generation (Python: 700)


def freeze_startup_heap(young_threshold: int = YOUNG_COLLECTION_THRESHOLD) -> int:
    """Takes the objects alive at the end of start-up (the model, its tokenizers, the imported
    libraries: hundreds of thousands of objects) out of the cyclic garbage collector's passes,
    collects the youngest generation every `young_threshold` allocations instead of every 700, and
    returns how many objects were frozen.

    A full collection walks all of the start-up objects while holding the GIL, so the model streams
    cannot hand back a batch meanwhile, and the query service's loaded index (several objects a chunk)
    makes every full collection longer as the collection grows; the young generation at 10,000 keeps
    full collections rare (figures: docs/benchmarks.md). The ingest service calls it after recovery,
    the query service once its index is loaded. Reference counting still frees a frozen object that
    stops being used; only a cycle among them would stay, and start-up objects are kept for the life
    of the process."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, oldest)
    return gc.get_freeze_count()


def run_service_main(main: Callable[[], Coroutine[Any, Any, None]], service: str) -> None:
    """asyncio.run(main()) for a service's __main__: a start-up refusal (a RagrpcError such as
    FAILED_PRECONDITION for a feature the server lacks, or a bad setting) ends the process with
    exit code 2 and one line a person can act on, not a traceback."""
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    except (errors.RagrpcError, ValueError) as exc:
        message = exc.message if isinstance(exc, errors.RagrpcError) else str(exc)
        code = errors.status_name(exc) if isinstance(exc, errors.RagrpcError) else "INVALID_ARGUMENT"
        logging.getLogger(service).error("%s cannot start: %s: %s", service, code, message)
        sys.exit(2)
