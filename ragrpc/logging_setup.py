"""The one logging configuration, applied by each service's __main__."""

from __future__ import annotations

import logging
import sys

from ragrpc.request_context import RequestIdLogFilter


def configure_logging(level: str = "INFO", service: str = "ragrpc") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        f"%(asctime)s %(levelname)s {service} [%(request_id)s] %(name)s: %(message)s"))
    handler.addFilter(RequestIdLogFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "urllib3", "filelock", "sentence_transformers", "pymilvus"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
