"""What a failed Milvus call means, from the client's exception types and status codes (never from
the wording of a message, which changes between pymilvus and server versions).

  UNAVAILABLE  the server could not be reached or refused for load: a gRPC UNAVAILABLE,
               DEADLINE_EXCEEDED, CANCELLED or RESOURCE_EXHAUSTED status, a channel that never
               became ready (grpc.FutureTimeoutError), pymilvus' ConnectError /
               MilvusUnavailableException / ConnectionNotExistException, its CONNECT_FAILED (2)
               and RATE_LIMIT (8) codes, or a socket error. The call may have been applied (a
               reply lost after the server acted), so only idempotent calls are repeated as they
               are; an insert is repeated for the rows that did not land (MilvusConnection).
  RELEASED     the collection is not loaded (code 101: a restarted server comes back with every
               collection released).
  TOO_LARGE    the answer was over a gRPC message limit (RESOURCE_EXHAUSTED "... message larger
               than max": milvus-lite answers at most 256 MB). The status alone cannot tell it
               from a server's load shedding, so here (only) gRPC core's own wording decides, not
               the server's. Repeating the same call does not help; asking for less does.
  REFUSED      anything else: the server answered and refused (bad request, schema); repeating
               it does not help.

pymilvus wraps what it retried itself in a MilvusException whose code is the gRPC status and
whose cause is the gRPC error; the chain of causes is followed, so the original type decides.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator

import grpc

_UNAVAILABLE_STATUSES = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
_CONNECT_FAILED = 2  # pymilvus Status.CONNECT_FAILED
_RATE_LIMIT = 8  # pymilvus ErrorCode.RATE_LIMIT
_COLLECTION_NOT_LOADED = 101
_TOO_LARGE_WORDING = "message larger than max"  # gRPC core: "Sent/Received message larger than max (N vs. M)"
_UNAVAILABLE_TYPES = ("ConnectError", "MilvusUnavailableException", "ConnectionNotExistException")


class Failure(enum.Enum):
    UNAVAILABLE = "unavailable"
    RELEASED = "released"
    TOO_LARGE = "too_large"
    REFUSED = "refused"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _status_of(exc: BaseException) -> object:
    if isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)):
        try:
            return exc.code()
        except Exception:  # noqa: BLE001 - a RpcError without a status
            return None
    return getattr(exc, "code", None)  # MilvusException.code is a property (an int or a StatusCode)


def classify(exc: BaseException) -> Failure:
    for link in _chain(exc):
        if isinstance(link, grpc.FutureTimeoutError):
            return Failure.UNAVAILABLE
        if type(link).__name__ in _UNAVAILABLE_TYPES:
            return Failure.UNAVAILABLE
        status = _status_of(link)
        if isinstance(status, grpc.StatusCode):
            if status is grpc.StatusCode.RESOURCE_EXHAUSTED and _TOO_LARGE_WORDING in _details_of(link):
                return Failure.TOO_LARGE
            if status in _UNAVAILABLE_STATUSES:
                return Failure.UNAVAILABLE
        elif isinstance(status, int) and not isinstance(status, bool):
            if status in (_CONNECT_FAILED, _RATE_LIMIT):
                return Failure.UNAVAILABLE
            if status == _COLLECTION_NOT_LOADED:
                return Failure.RELEASED
        if isinstance(link, OSError | TimeoutError):  # ConnectionError, socket errors
            return Failure.UNAVAILABLE
    return Failure.REFUSED


def _details_of(exc: BaseException) -> str:
    details = getattr(exc, "details", None)
    if callable(details):
        try:
            return f"{details()}"
        except Exception:  # noqa: BLE001 - a RpcError without details
            return ""
    return f"{exc}"


def is_answer_too_large(exc: BaseException) -> bool:
    return classify(exc) is Failure.TOO_LARGE


def is_unavailable(exc: BaseException) -> bool:
    return classify(exc) is Failure.UNAVAILABLE
