"""Server-side deadlines: every call ends within a configured time, whatever the client's
deadline (a client's own shorter deadline is enforced by gRPC itself)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from ragrpc import errors
from ragrpc.grpc_errors import rewrap_handler


class DeadlineInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s

    def _expired(self, method: str) -> errors.DeadlineError:
        return errors.DeadlineError(
            f"{method.rsplit('/', 1)[-1]} exceeded the server's deadline of {self._timeout_s:.0f}s",
            metadata={"timeout_s": str(self._timeout_s)},
        )

    def _wrap_unary(self, behavior: Callable[..., Awaitable[Any]], method: str) -> Callable[..., Awaitable[Any]]:
        async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
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
