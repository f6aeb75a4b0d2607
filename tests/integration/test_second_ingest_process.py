"""Two ingest service processes against one collection (a real milvus-lite server, the real
services as OS processes): the second refuses to start with FAILED_PRECONDITION naming the
holder of the writer lease, and starts once the first stopped (a clean stop releases the lease;
after a kill -9 on the same host the dead holder is replaced at once)."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from tests.reliability.conftest import RealStack, ServiceProcess, free_port, service_env

pytestmark = pytest.mark.slow


def _second(stack: RealStack, root: Path) -> ServiceProcess:
    assert stack.ingest is not None
    env = dict(stack.ingest.env)
    port = free_port()
    env["RAGRPC_INGEST_PORT"] = str(port)
    return ServiceProcess("ingest-2", "ingest_service", port, service_env(env), root)


def _wait_exit(process: ServiceProcess, timeout_s: float = 180.0) -> int:
    assert process.process is not None
    return process.process.wait(timeout=timeout_s)


def test_a_second_ingest_process_is_refused_until_the_first_stops(tmp_path: Path) -> None:
    stack = RealStack(tmp_path, env={"RAGRPC_EMBEDDING_BACKEND": "torch"}).start(query=False)
    second = _second(stack, tmp_path)
    try:
        assert stack.ingest is not None
        second.spawn()
        assert _wait_exit(second) == 2, second.log_tail()
        log = second.log_text()
        assert "FAILED_PRECONDITION" in log and "holds the writer lease" in log, log[-2000:]
        assert re.search(rf":{stack.ingest.pid}:", log), "the refusal names the holder (host:pid:id)"
        assert stack.ingest.alive()  # the first one goes on, its work not rolled back

        stack.ingest.kill(signal.SIGTERM)  # a clean stop releases the lease
        started = time.monotonic()
        second.start()
        assert time.monotonic() - started < 120
        assert "took over the writer lease" not in second.log_text()  # released, not taken over

        second.kill(signal.SIGKILL)  # a crash: the lease stays, its holder's pid is gone from this host
        stack.ingest.start()
        assert "took over the writer lease" in stack.ingest.log_text()
    finally:
        second.kill(signal.SIGKILL)
        stack.stop()
