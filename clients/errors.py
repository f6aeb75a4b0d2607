"""Typed client exceptions decoded from a failed gRPC call.

The services send a google.rpc.Status in the trailing metadata key `grpc-status-details-bin`
carrying ErrorInfo (reason, domain "ragrpc.v1", metadata), BadRequest (field violations)
and, for UNAVAILABLE, RetryInfo. `from_rpc_error` turns any `grpc.RpcError` (sync or
`grpc.aio`) into the matching `RagrpcClientError` subclass with those details decoded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

STATUS_DETAILS_KEY = "grpc-status-details-bin"


@dataclass(frozen=True)
class FieldViolation:
    """One offending request field (google.rpc.BadRequest.FieldViolation)."""

    field: str
    description: str


class RagrpcClientError(Exception):
    """A call failed. `code` is the gRPC status code; the rest comes from the rich status."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: str = "",
        domain: str = "",
        metadata: dict[str, str] | None = None,
        field_violations: Iterable[FieldViolation] = (),
        retry_delay: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason
        self.domain = domain
        self.metadata = dict(metadata or {})
        self.field_violations = list(field_violations)
        self.retry_delay = retry_delay

    @property
    def code_name(self) -> str:
        return self.code.name

    def __str__(self) -> str:
        text = f"{self.code.name}: {self.message}"
        if self.reason and self.reason != self.code.name:
            text += f" (reason {self.reason})"
        for violation in self.field_violations:
            if violation.description != self.message:
                text += f"; {violation.field}: {violation.description}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code.name,
            "message": self.message,
            "reason": self.reason,
            "domain": self.domain,
            "metadata": self.metadata,
            "field_violations": [{"field": v.field, "description": v.description} for v in self.field_violations],
            "retry_delay": self.retry_delay,
        }


class InvalidArgument(RagrpcClientError):
    """INVALID_ARGUMENT: the request or the document is wrong; `field_violations` says where."""


class NotFound(RagrpcClientError):
    """NOT_FOUND: the document or job does not exist."""


class AlreadyExists(RagrpcClientError):
    """ALREADY_EXISTS."""


class FailedPrecondition(RagrpcClientError):
    """FAILED_PRECONDITION: the system is not in a state to do it."""


class ResourceExhausted(RagrpcClientError):
    """RESOURCE_EXHAUSTED: a configured limit was exceeded or the server is overloaded."""


class Unauthenticated(RagrpcClientError):
    """UNAUTHENTICATED: missing or wrong API key."""


class Unavailable(RagrpcClientError):
    """UNAVAILABLE: the server or a dependency is down; `retry_delay` suggests a wait."""


class DeadlineExceeded(RagrpcClientError):
    """DEADLINE_EXCEEDED: the call's deadline passed."""


class Internal(RagrpcClientError):
    """INTERNAL: a server bug; `metadata["incident"]` links to the server log."""


class Cancelled(RagrpcClientError):
    """CANCELLED: the call was cancelled (usually by this client)."""


def cancelled_by_client() -> Cancelled:
    """The error a stream raises when read after this client cancelled it."""
    return Cancelled(grpc.StatusCode.CANCELLED, "the call was cancelled by the client", reason="CLIENT_CANCELLED")


def _error_class_for(code: grpc.StatusCode) -> type[RagrpcClientError]:
    classes: dict[grpc.StatusCode, type[RagrpcClientError]] = {
        grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
        grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
        grpc.StatusCode.NOT_FOUND: NotFound,
        grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
        grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
        grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
        grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
        grpc.StatusCode.PERMISSION_DENIED: Unauthenticated,
        grpc.StatusCode.UNAVAILABLE: Unavailable,
        grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
        grpc.StatusCode.INTERNAL: Internal,
        grpc.StatusCode.DATA_LOSS: Internal,
        grpc.StatusCode.CANCELLED: Cancelled,
    }
    return classes.get(code, RagrpcClientError)


def _status_details(err: grpc.RpcError) -> status_pb2.Status | None:
    trailing = getattr(err, "trailing_metadata", None)
    pairs = trailing() if callable(trailing) else None
    for key, value in pairs or ():
        if key == STATUS_DETAILS_KEY and isinstance(value, bytes):
            try:
                return status_pb2.Status.FromString(value)
            except Exception:  # noqa: BLE001 - a garbled detail must not hide the real error
                return None
    return None


def _decode_details(status: status_pb2.Status | None) -> dict[str, Any]:
    found: dict[str, Any] = {"field_violations": []}
    if status is None:
        return found
    info = error_details_pb2.ErrorInfo()
    bad_request = error_details_pb2.BadRequest()
    retry = error_details_pb2.RetryInfo()
    for detail in status.details:
        if detail.Is(info.DESCRIPTOR) and detail.Unpack(info):
            found.update(reason=info.reason, domain=info.domain, metadata=dict(info.metadata))
        elif detail.Is(bad_request.DESCRIPTOR) and detail.Unpack(bad_request):
            found["field_violations"] += [FieldViolation(v.field, v.description) for v in bad_request.field_violations]
        elif detail.Is(retry.DESCRIPTOR) and detail.Unpack(retry):
            found["retry_delay"] = retry.retry_delay.ToMilliseconds() / 1000.0
    return found


def from_rpc_error(err: grpc.RpcError) -> RagrpcClientError:
    """The typed exception for a failed call (sync or aio)."""
    code_fn = getattr(err, "code", None)
    code = code_fn() if callable(code_fn) else None
    if not isinstance(code, grpc.StatusCode):
        code = grpc.StatusCode.UNKNOWN
    details_fn = getattr(err, "details", None)
    message = (details_fn() if callable(details_fn) else None) or str(err) or code.name
    status = _status_details(err)
    if status is not None and status.message:
        message = status.message
    return _error_class_for(code)(code, message, **_decode_details(status))
