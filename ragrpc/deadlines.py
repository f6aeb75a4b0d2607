"""Server-side deadlines: every call ends within a configured time, whatever the client's
deadline (a client's own shorter deadline is enforced by gRPC itself).

The interceptor also records when the call must end (the sooner of the two) in a contextvar:
`time_left_s()` tells code below the servicers (an upstream call with its own timeout, such as
the remote reranker) how long it may still take. Work run in an executor sees it when it runs in a
copy of the call's context (`contextvars.copy_context().run`).
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from ragrpc import errors
from ragrpc.grpc_errors import rewrap_handler

_call_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("ragrpc_call_deadline", default=None)


def time_left_s() -> float | None:
    """Seconds left until the current call's deadline (may be <= 0); None outside a call."""
    deadline = _call_deadline.get()
    return None if deadline is None else deadline - time.monotonic()


def set_call_deadline(timeout_s: float) -> None:
    """The current call must end within timeout_s from now (time.monotonic() based)."""
    _call_deadline.set(time.monotonic() + timeout_s)


class DeadlineInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s

    def _expired(self, method: str) -> errors.DeadlineError:
        return errors.DeadlineError(
            f"{method.rsplit('/', 1)[-1]} exceeded the server's deadline of {self._timeout_s:.0f}s",
            metadata={"timeout_s": str(self._timeout_s)},
        )

    def _enter(self, context: grpc.aio.ServicerContext) -> None:
        client_left = context.time_remaining()
        set_call_deadline(self._timeout_s if client_left is None else min(self._timeout_s, client_left))

    def _wrap_unary(self, behavior: Callable[..., Awaitable[Any]], method: str) -> Callable[..., Awaitable[Any]]:
        async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
            self._enter(context)
            try:
                async with asyncio.timeout(self._timeout_s):
                    return await behavior(request, context)
            except TimeoutError:
                raise self._expired(method) from None

        return wrapper

    def _wrap_stream(
        self, behavior: Callable[..., AsyncIterator[Any]], method: str
    ) -> Callable[..., AsyncIterator[Any]]:
        async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            self._enter(context)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self._timeout_s
            iterator = behavior(request, context).__aiter__()
            try:
                while True:
                    try:
                        async with asyncio.timeout_at(deadline):
                            item = await iterator.__anext__()
                    except StopAsyncIteration:
                        return
                    except TimeoutError:
                        raise self._expired(method) from None
                    yield item  # time spent waiting for the client to read is not ours to cut short
            finally:
                close = getattr(iterator, "aclose", None)
                if close is not None:
                    await close()

        return wrapper

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        return rewrap_handler(handler, handler_call_details.method, self._wrap_unary, self._wrap_stream)
