"""The one logging configuration, applied by each service's __main__: human-readable lines, or
one JSON object per line for log collectors (Loki, Elasticsearch, Cloud Logging).

JSON fields: ts (UTC, ISO 8601 with milliseconds), level, service, logger, message, request_id
(set on the record by `ragrpc.request_context.RequestIdLogFilter`; "-" outside a call),
exception / stack (formatted text, when present) and any `extra={...}` fields of the call.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from ragrpc.request_context import RequestIdLogFilter


def configure_logging(level: str = "INFO", service: str = "ragrpc", log_format: str = "text") -> None:
    """text: human-readable lines; json: one JSON object per line, each with the request id."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format.lower() == "json":
        handler.setFormatter(JsonLogFormatter(service))
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)s {service} [%(request_id)s] %(name)s: %(message)s")
        )
    handler.addFilter(RequestIdLogFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "urllib3", "filelock", "sentence_transformers"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    # pymilvus logs a traceback for every failed call (one per request during a Milvus outage); each
    # failure is translated into a ragrpc error that callers get and the services log, so only DEBUG keeps them.
    logging.getLogger("pymilvus").setLevel(logging.DEBUG if root.level <= logging.DEBUG else logging.CRITICAL)


# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "request_id",
    "taskName",
}


class JsonLogFormatter(logging.Formatter):
    """Formats a record as one line of JSON (newlines inside values are escaped)."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "service": self._service,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or "-",
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRIBUTES and not key.startswith("_") and key not in payload:
                payload[key] = value
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            payload["exception"] = record.exc_text
        if record.stack_info:
            payload["stack"] = self.formatStack(record.stack_info)
        return json.dumps(payload, ensure_ascii=False, default=str)
