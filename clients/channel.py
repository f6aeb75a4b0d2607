"""Channel factory shared by the sync and async clients.

Every channel gets explicit message-size limits, keepalive and a gRPC service config that
turns on retries with exponential backoff:

* IngestService: only UNAVAILABLE is retried (the server never started the write, and
  re-sending identical content is a no-op because documents are deduplicated by hash).
* RetrieveService: its methods are idempotent reads, so UNAVAILABLE and RESOURCE_EXHAUSTED
  (overload) are retried. DEADLINE_EXCEEDED is never retried: the deadline is the caller's
  whole budget.

gRPC retries a call only before the server has sent a response message, so a stream that
already yielded events is never replayed.
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


def _retry_policy(codes: list[str]) -> dict[str, Any]:
    return {
        "maxAttempts": MAX_RETRY_ATTEMPTS,
        "initialBackoff": "0.2s",
        "maxBackoff": "5s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": codes,
    }


def service_config() -> dict[str, Any]:
    """The gRPC service config (retry policies per service)."""
    return {
        "methodConfig": [
            {"name": [{"service": INGEST_SERVICE}], "retryPolicy": _retry_policy(["UNAVAILABLE"])},
            {
                "name": [{"service": RETRIEVE_SERVICE}],
                "retryPolicy": _retry_policy(["UNAVAILABLE", "RESOURCE_EXHAUSTED"]),
            },
        ],
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
