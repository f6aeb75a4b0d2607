"""Per-call context (request id, tenant) carried in contextvars, set by one interceptor.

Servicers read `current_tenant()`; logs carry `current_request_id()` through
`RequestIdLogFilter`. An authenticating resolver (API key -> tenant) can replace the
default one without touching the servicers.
"""

from __future__ import annotations

import contextvars
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import grpc

from ragrpc.grpc_errors import rewrap_handler

_request_id: contextvars.ContextVar[str] = contextvars.ContextVar("ragrpc_request_id", default="-")
_tenant: contextvars.ContextVar[str] = contextvars.ContextVar("ragrpc_tenant", default="")

REQUEST_ID_KEY = "x-request-id"


def current_request_id() -> str:
    return _request_id.get()


def current_tenant() -> str:
    tenant = _tenant.get()
    if not tenant:
        raise RuntimeError("no tenant in this context: the RequestContextInterceptor is not installed")
    return tenant


class TenantResolver(Protocol):
    """Decides the tenant of a call from its metadata; raises UnauthenticatedError to refuse."""

    def tenant_for(self, metadata: dict[str, str]) -> str: ...


class FixedTenantResolver:
    """Every call belongs to one configured tenant (no authentication)."""

    def __init__(self, tenant: str) -> None:
        self._tenant = tenant

    def tenant_for(self, metadata: dict[str, str]) -> str:
        return self._tenant


class RequestIdLogFilter(logging.Filter):
    """Adds `request_id` to every log record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = current_request_id()
        return True


def _metadata_of(context: grpc.aio.ServicerContext) -> dict[str, str]:
    pairs = context.invocation_metadata() or ()
    return {k.lower(): v for k, v in pairs if isinstance(v, str)}


class RequestContextInterceptor(grpc.aio.ServerInterceptor):
    """Sets request id and tenant for the duration of each call (health/reflection excluded)."""

    def __init__(self, resolver: TenantResolver) -> None:
        self._resolver = resolver

    def _enter(self, context: grpc.aio.ServicerContext) -> None:
        metadata = _metadata_of(context)
        request_id = metadata.get(REQUEST_ID_KEY) or uuid.uuid4().hex[:16]
        _request_id.set(request_id[:64])
        _tenant.set(self._resolver.tenant_for(metadata))

    def _wrap_unary(self, behavior: Callable[..., Awaitable[Any]], _method: str) -> Callable[..., Awaitable[Any]]:
        async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
            self._enter(context)
            return await behavior(request, context)

        return wrapper

    def _wrap_stream(
        self, behavior: Callable[..., AsyncIterator[Any]], _method: str
    ) -> Callable[..., AsyncIterator[Any]]:
        async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            self._enter(context)
            async for item in behavior(request, context):
                yield item

        return wrapper

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        return rewrap_handler(handler, handler_call_details.method, self._wrap_unary, self._wrap_stream)
