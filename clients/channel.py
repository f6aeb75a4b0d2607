"""Channel factory shared by the sync and async clients.

Every channel gets explicit message-size limits, keepalive and a gRPC service config with a
retry policy per method and retry throttling.

Rule: a call is retried automatically only when (1) repeating it cannot change the outcome
(a read, or a write the server makes a no-op when repeated), (2) it failed with UNAVAILABLE
and (3) the retry budget of the target is not spent (throttling, below). A method that is not
idempotent gets no retryPolicy at all; so does a method missing from the table (the default).

    method                                   retried  why
    RetrieveService.Retrieve, .Ask           yes      reads (Ask may call an LLM again; nothing is stored)
    IngestService.GetDocument, .ListDocuments,
                  .GetIngestJob              yes      reads
    IngestService.UploadDocument             yes (1)  the same bytes under the same id (given, or derived
                                                      from the content hash) are stored once: the repeat
                                                      answers `unchanged`
    IngestService.IngestDocuments            yes      each document is deduplicated the same way; a retry
                                                      may start a second job reporting them unchanged
    IngestService.DeleteDocument             yes (2)  the end state (the document is gone) is the same
    IngestService.UpdateDocument             no       a repeat can overwrite an update made in between, and
                                                      once guarded by an etag a repeat of an applied update
                                                      fails its precondition
    grpc.health.v1.Health (every method)     no       a probe reports the state now; callers poll
                                                      (wait_until_serving), and a probe without a retry
                                                      policy spends none of the budget of real calls

(1) Only while what was sent fits gRPC's per-call retry buffer (`grpc.per_rpc_retry_buffer_size`,
    256 KiB by default): a larger upload is committed to its first attempt, and the caller sees
    Unavailable and sends it again.
(2) A retried delete whose first attempt did delete the document (the answer was lost) ends in
    NotFound: for a delete, NotFound means "gone"; callers that only need it gone treat it as done.

Codes: only UNAVAILABLE is retried (the server was not reached, or a dependency was down and
the server says so with RetryInfo). RESOURCE_EXHAUSTED is not: the servers use it both for
fixed limits that fail again (upload size, TOO_MANY_CHUNKS, PDF pages) and for load shedding
(RAGRPC_MAX_CONCURRENT_RPCS, INGEST_QUEUE_FULL) without a retry hint (no RetryInfo, no
grpc-retry-pushback-ms), so a retry would only add load to a busy server; callers get
ResourceExhausted and back off. DEADLINE_EXCEEDED is never retried: the deadline is the
caller's budget for all attempts together.

Throttling (gRFC A6, `retryThrottling`): one token bucket per target, shared by every channel
of the process to it. Each retryable failure takes a token, each success of a method with a
retry policy gives back `tokenRatio`; while the bucket holds maxTokens/2 or fewer, failed calls
are not retried. So a storm of failures costs at most about maxTokens/2 extra attempts, then
retries resume only once fewer than about 1 call in 1/tokenRatio fails.

gRPC retries a call only until the server sends response headers or a message, so a stream
that already yielded events is never replayed.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import grpc

INGEST_SERVICE = "ragrpc.v1.IngestService"
RETRIEVE_SERVICE = "ragrpc.v1.RetrieveService"
HEALTH_SERVICE = "grpc.health.v1.Health"
REQUEST_ID_KEY = "x-request-id"
AUTHORIZATION_KEY = "authorization"

DEFAULT_UNARY_TIMEOUT_S = 30.0
DEFAULT_STREAM_TIMEOUT_S = 300.0
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_RETRY_ATTEMPTS = 4
RETRY_MAX_TOKENS = 20
RETRY_TOKEN_RATIO = 0.1


@dataclass(frozen=True)
class ChannelSettings:
    """How to reach one service and the defaults of its calls."""

    target: str
    api_key: str | None = None
    secure: bool = False
    root_certificates: bytes | None = None
    timeout: float = DEFAULT_UNARY_TIMEOUT_S
    stream_timeout: float = DEFAULT_STREAM_TIMEOUT_S
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    keepalive_time_ms: int = 60_000
    keepalive_timeout_ms: int = 20_000

    def deadline(self, timeout: float | None, *, stream: bool) -> float:
        """Seconds for one call: the explicit value, else the default for its kind."""
        if timeout is not None:
            return timeout
        return self.stream_timeout if stream else self.timeout

    def call_metadata(self, request_id: str | None = None) -> tuple[tuple[str, str], ...]:
        """Metadata of one call: the bearer key (when set) and a request id for the server logs."""
        pairs = [(REQUEST_ID_KEY, request_id or uuid.uuid4().hex[:16])]
        if self.api_key:
            pairs.append((AUTHORIZATION_KEY, f"Bearer {self.api_key}"))
        return tuple(pairs)


# The table of the module docstring: method name -> retried on UNAVAILABLE.
RETRIED_METHODS: dict[str, dict[str, bool]] = {
    INGEST_SERVICE: {
        "UploadDocument": True,
        "IngestDocuments": True,
        "GetDocument": True,
        "ListDocuments": True,
        "UpdateDocument": False,
        "DeleteDocument": True,
        "GetIngestJob": True,
    },
    RETRIEVE_SERVICE: {"Retrieve": True, "Ask": True},
}
NOT_RETRIED_SERVICES = (HEALTH_SERVICE,)  # every method, present and future
RETRYABLE_STATUS_CODES = ("UNAVAILABLE",)


def _retry_policy() -> dict[str, Any]:
    return {
        "maxAttempts": MAX_RETRY_ATTEMPTS,
        "initialBackoff": "0.2s",
        "maxBackoff": "5s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": list(RETRYABLE_STATUS_CODES),
    }


def _names(retried: bool) -> list[dict[str, str]]:
    return [
        {"service": service, "method": method}
        for service, methods in RETRIED_METHODS.items()
        for method, is_retried in methods.items()
        if is_retried is retried
    ]


def service_config() -> dict[str, Any]:
    """The gRPC service config: one rule per method (see the table above), retry throttling."""
    not_retried = _names(False) + [{"service": service} for service in NOT_RETRIED_SERVICES]
    return {
        "methodConfig": [
            {"name": _names(True), "retryPolicy": _retry_policy()},
            {"name": not_retried},  # no retryPolicy: one attempt
        ],
        "retryThrottling": {"maxTokens": RETRY_MAX_TOKENS, "tokenRatio": RETRY_TOKEN_RATIO},
    }


def channel_options(settings: ChannelSettings) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        ("grpc.keepalive_time_ms", settings.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", settings.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", json.dumps(service_config())),
    ]


def _credentials(settings: ChannelSettings) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=settings.root_certificates)


def create_channel(settings: ChannelSettings) -> grpc.Channel:
    """A blocking channel."""
    options = channel_options(settings)
    if settings.secure:
        return grpc.secure_channel(settings.target, _credentials(settings), options=options)
    return grpc.insecure_channel(settings.target, options=options)


def create_aio_channel(settings: ChannelSettings) -> grpc.aio.Channel:
    """An asyncio channel (create it inside the event loop that uses it)."""
    options = channel_options(settings)
    if settings.secure:
        return grpc.aio.secure_channel(settings.target, _credentials(settings), options=options)
    return grpc.aio.insecure_channel(settings.target, options=options)
