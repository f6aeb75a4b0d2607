"""The one logging configuration, applied by each service's __main__."""

from __future__ import annotations

import logging
import sys

from ragrpc.json_logging import JsonLogFormatter
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
