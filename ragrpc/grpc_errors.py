"""The one mapping from ragrpc errors to gRPC status codes with google.rpc details.

`ErrorMappingInterceptor` wraps every handler of an aio server: a RagrpcError raised by a
servicer (or anything below it) becomes a status with ErrorInfo (reason, domain,
metadata), BadRequest (field violations) and RetryInfo (for UNAVAILABLE); any other
exception becomes INTERNAL with a request id the logs also carry.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from ragrpc import errors

logger = logging.getLogger(__name__)

ERROR_DOMAIN = "ragrpc.v1"
STATUS_DETAILS_KEY = "grpc-status-details-bin"


def status_code_for(error: errors.RagrpcError) -> grpc.StatusCode:
    return grpc.StatusCode[errors.status_name(error)]


# The status travels in trailing metadata, which clients cap (8 KiB by default): a message that
# echoes a long request value would otherwise turn the answer into a client-side RESOURCE_EXHAUSTED.
MAX_MESSAGE_BYTES = 800
MAX_METADATA_VALUE_BYTES = 200


def clip(text: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    """text cut to at most `limit` UTF-8 bytes (marked with an ellipsis when cut)."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore") + "…"


def basic_status(code_name: str, message: str, reason: str, metadata: dict[str, str]) -> status_pb2.Status:
    """A google.rpc.Status with its ErrorInfo, from an error's parts (e.g. as kept in a job record)."""
    code = getattr(code_pb2, code_name, code_pb2.INTERNAL)
    status = status_pb2.Status(code=code, message=clip(message))
    clipped = {clip(k, MAX_METADATA_VALUE_BYTES): clip(str(v), MAX_METADATA_VALUE_BYTES) for k, v in metadata.items()}
    info = error_details_pb2.ErrorInfo(reason=reason or code_name, domain=ERROR_DOMAIN, metadata=clipped)
    status.details.add().Pack(info)
    return status


def rich_status(error: errors.RagrpcError) -> tuple[grpc.StatusCode, status_pb2.Status]:
    """The gRPC code and google.rpc.Status (with details) for an error."""
    code = status_code_for(error)
    status = basic_status(code.name, error.message, error.reason, error.metadata)
    violations = getattr(error, "field_violations", [])
    if violations:
        bad = error_details_pb2.BadRequest()
        for field, description in violations:
            bad.field_violations.add(field=clip(field, MAX_METADATA_VALUE_BYTES), description=clip(description))
        status.details.add().Pack(bad)
    if isinstance(error, errors.UnavailableError):
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(int(error.retry_after_s * 1000))
        status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=delay))
    return code, status


async def abort_with_error(context: grpc.aio.ServicerContext, error: errors.RagrpcError) -> None:
    code, status = rich_status(error)
    await context.abort(code, status.message, trailing_metadata=((STATUS_DETAILS_KEY, status.SerializeToString()),))


async def _map_exception(context: grpc.aio.ServicerContext, exc: BaseException, method: str) -> None:
    if isinstance(exc, errors.RagrpcError):
        if isinstance(exc, errors.InternalError | errors.UnavailableError):
            logger.warning("%s failed: %s", method, exc.message)
        await abort_with_error(context, exc)
        return
    incident = uuid.uuid4().hex[:12]
    logger.exception("%s failed unexpectedly (incident %s)", method, incident)
    await abort_with_error(
        context,
        errors.InternalError(
            f"internal error (incident {incident}); the server log has the details", metadata={"incident": incident}
        ),
    )


def _is_grpc_abort(exc: BaseException) -> bool:
    # context.abort() raises AbortError, which must pass through untouched.
    return isinstance(exc, grpc.aio.AbortError)


def _wrap_unary(behavior: Callable[..., Awaitable[Any]], method: str) -> Callable[..., Awaitable[Any]]:
    async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behavior(request, context)
        except Exception as exc:  # noqa: BLE001 - this is the one place errors are mapped
            if _is_grpc_abort(exc):
                raise
            await _map_exception(context, exc, method)

    return wrapper


def _wrap_stream(behavior: Callable[..., AsyncIterator[Any]], method: str) -> Callable[..., AsyncIterator[Any]]:
    async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            async for item in behavior(request, context):
                yield item
        except Exception as exc:  # noqa: BLE001
            if _is_grpc_abort(exc):
                raise
            await _map_exception(context, exc, method)

    return wrapper


UnaryWrap = Callable[[Callable[..., Awaitable[Any]], str], Callable[..., Awaitable[Any]]]
StreamWrap = Callable[[Callable[..., AsyncIterator[Any]], str], Callable[..., AsyncIterator[Any]]]


def rewrap_handler(
    handler: grpc.RpcMethodHandler | None, method: str, wrap_unary: UnaryWrap, wrap_stream: StreamWrap
) -> grpc.RpcMethodHandler | None:
    """Wraps a handler's behavior (any of the four kinds); health and reflection stay untouched."""
    if handler is None or method.startswith("/grpc.health") or method.startswith("/grpc.reflection"):
        return handler
    if handler.unary_unary:
        return handler._replace(unary_unary=wrap_unary(handler.unary_unary, method))
    if handler.stream_unary:
        return handler._replace(stream_unary=wrap_unary(handler.stream_unary, method))
    if handler.unary_stream:
        return handler._replace(unary_stream=wrap_stream(handler.unary_stream, method))
    if handler.stream_stream:
        return handler._replace(stream_stream=wrap_stream(handler.stream_stream, method))
    return handler


class ErrorMappingInterceptor(grpc.aio.ServerInterceptor):
    """Maps exceptions of every handler to rich gRPC statuses."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        return rewrap_handler(handler, handler_call_details.method, _wrap_unary, _wrap_stream)
