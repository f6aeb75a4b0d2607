"""The error tree of ragrpc. Code below the servicers raises these; exactly one place
(`ragrpc.grpc_errors`) turns them into gRPC status codes with google.rpc details.

    RagrpcError                      (base; never raised itself)
    ├── InvalidInputError            INVALID_ARGUMENT   the request or the document is wrong
    │   ├── UnsupportedMediaTypeError                   format not supported (lists the supported ones)
    │   ├── DocumentParseError                          the file is corrupt or cannot be read
    │   └── PasswordError                               encrypted PDF: password missing or wrong
    ├── LimitExceededError           RESOURCE_EXHAUSTED a configured limit was exceeded / overload
    ├── NotFoundError                NOT_FOUND          a document or job does not exist
    ├── AlreadyExistsError           ALREADY_EXISTS
    ├── PreconditionError            FAILED_PRECONDITION the system is not in a state to do it
    │   └── ModelMismatchError                          collection built with another embedding model
    ├── UnauthenticatedError         UNAUTHENTICATED
    ├── UnavailableError             UNAVAILABLE        retriable: store or upstream down (retry_after_s)
    ├── DeadlineError                DEADLINE_EXCEEDED
    └── InternalError                INTERNAL           a bug or an unexpected failure

Every error has a human message, a machine `reason` (UPPER_SNAKE_CASE, sent as
google.rpc.ErrorInfo.reason) and string `metadata` (ErrorInfo.metadata).
"""

from __future__ import annotations


class RagrpcError(Exception):
    """Base of all ragrpc errors."""

    default_reason = "ERROR"

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.metadata = dict(metadata or {})


class InvalidInputError(RagrpcError):
    """The request or the document content is wrong; retrying the same input fails again.

    field_violations: (field path, description) pairs, sent as google.rpc.BadRequest.
    """

    default_reason = "INVALID_INPUT"

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        reason: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, reason=reason, metadata=metadata)
        self.field_violations: list[tuple[str, str]] = [(field, message)] if field else []


class UnsupportedMediaTypeError(InvalidInputError):
    default_reason = "UNSUPPORTED_MEDIA_TYPE"


class DocumentParseError(InvalidInputError):
    default_reason = "DOCUMENT_UNREADABLE"


class PasswordError(InvalidInputError):
    default_reason = "PDF_PASSWORD"


class LimitExceededError(RagrpcError):
    """A configured limit (size, count, concurrency) was exceeded."""

    default_reason = "LIMIT_EXCEEDED"


class NotFoundError(RagrpcError):
    default_reason = "NOT_FOUND"


class AlreadyExistsError(RagrpcError):
    default_reason = "ALREADY_EXISTS"


class PreconditionError(RagrpcError):
    default_reason = "FAILED_PRECONDITION"


class ModelMismatchError(PreconditionError):
    default_reason = "EMBEDDING_MODEL_MISMATCH"


class AbortedError(RagrpcError):
    """A concurrent change got in the way (the document was deleted while it was being ingested, an
    etag is stale, an ingestion holds the document); the caller may read the resource again and retry."""

    default_reason = "ABORTED"


class UnauthenticatedError(RagrpcError):
    default_reason = "UNAUTHENTICATED"


class UnavailableError(RagrpcError):
    """A dependency (Milvus, an LLM endpoint) is down; the call may succeed later."""

    default_reason = "UNAVAILABLE"

    def __init__(
        self,
        message: str,
        *,
        retry_after_s: float = 1.0,
        reason: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, reason=reason, metadata=metadata)
        self.retry_after_s = retry_after_s


class DeadlineError(RagrpcError):
    default_reason = "DEADLINE_EXCEEDED"


class InternalError(RagrpcError):
    default_reason = "INTERNAL"


_STATUS_NAMES: list[tuple[type[RagrpcError], str]] = [
    (InvalidInputError, "INVALID_ARGUMENT"),
    (LimitExceededError, "RESOURCE_EXHAUSTED"),
    (NotFoundError, "NOT_FOUND"),
    (AlreadyExistsError, "ALREADY_EXISTS"),
    (PreconditionError, "FAILED_PRECONDITION"),
    (AbortedError, "ABORTED"),
    (UnauthenticatedError, "UNAUTHENTICATED"),
    (UnavailableError, "UNAVAILABLE"),
    (DeadlineError, "DEADLINE_EXCEEDED"),
    (InternalError, "INTERNAL"),
]


def status_name(error: RagrpcError) -> str:
    """The gRPC status code name of an error (the mapping, without importing grpc)."""
    for error_type, name in _STATUS_NAMES:
        if isinstance(error, error_type):
            return name
    return "INTERNAL"
