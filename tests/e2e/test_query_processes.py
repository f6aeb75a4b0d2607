"""The query service as several processes on one port (RAGRPC_QUERY_PROCESSES, query_service.worker_supervisor).

The supervisor's own rules first, with small worker functions of this module as the workers (real
spawned processes, no store): a worker that dies is restarted, one that refuses to start stops the
group with exit code 2, workers that keep dying stop it with 1, SIGTERM reaches every worker.

Then the real service (marked slow: a milvus-lite server, the ingest service and `python -m
query_service` with two workers, embeddings from a small OpenAI-compatible server so that no model
loads): both workers serve the port and answer, the second loads the snapshot the first wrote, a
read-your-writes token holds on whichever worker a call lands, a killed worker is restarted while
the other serves, SIGTERM stops them all.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from ragrpc.v1 import ingest_pb2, retrieve_pb2, retrieve_pb2_grpc
from tests.reliability.conftest import ServiceProcess, free_port, health, service_env, upload
from tests.support.embeddings_server import EmbeddingsServer
from tests.support.milvus_server import MilvusLiteServer

REPO = Path(__file__).resolve().parents[2]
WORKER_DIR = "RAGRPC_TEST_WORKER_DIR"  # where this module's stand-in workers leave their traces
SERVING_LINE = re.compile(r"query worker (\d+) \(pid (\d+)\) SERVING")


# --- stand-in workers (spawned by the supervisor: module-level functions) ------------------------------


def _flaky_worker(role, link) -> None:  # type: ignore[no-untyped-def]
    """Worker 1 dies once at its first start; otherwise reports SERVING and runs until SIGTERM."""
    traces = Path(os.environ[WORKER_DIR])
    first = traces / f"started-{role.index}"
    if role.index == 1 and not first.exists():
        first.write_text("")
        os._exit(3)
    stopped = False

    def stop(*_: object) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, stop)
    (traces / f"pid-{role.index}-{os.getpid()}").write_text(f"{role.binds_before_loading} {role.writes_snapshots}")
    link.serving()
    while not stopped:
        time.sleep(0.05)
    (traces / f"stopped-{os.getpid()}").write_text("")


def _waiting_first_worker(role, link) -> None:  # type: ignore[no-untyped-def]
    """Worker 0 reports SERVING only once worker 1 has started (which it does at once only beside a snapshot)."""
    traces = Path(os.environ[WORKER_DIR])
    deadline = time.monotonic() + 20
    while role.index == 0 and not any(traces.glob("pid-1-*")):
        if time.monotonic() > deadline:
            os._exit(4)
        time.sleep(0.05)
    _flaky_worker(role, link)


def _crashing_worker(role, link) -> None:  # type: ignore[no-untyped-def]
    raise RuntimeError("this worker always dies")


def _refusing_worker(role, link) -> None:  # type: ignore[no-untyped-def]
    sys.exit(2)


def _supervise(entry: str, traces: Path, **options: object) -> subprocess.Popen[str]:
    script = (
        "import dataclasses, logging, sys\n"
        "from ragrpc.config import Settings\n"
        "from query_service.worker_supervisor import QueryWorkerSupervisor\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "settings = dataclasses.replace(Settings(), host='127.0.0.1', query_port=0, shutdown_grace_s=1.0,\n"
        f"    index_snapshot_dir={str(traces)!r})\n"
        f"sys.exit(QueryWorkerSupervisor(settings, 2, {entry!r}, **{options!r}).run())\n"
    )
    env = {**os.environ, WORKER_DIR: str(traces), "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def _wait_for(predicate, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f}s: {what}")
        time.sleep(0.05)


def _pids(traces: Path, index: int) -> list[int]:
    return sorted(int(p.name.split("-")[2]) for p in traces.glob(f"pid-{index}-*"))


def test_the_supervisor_restarts_a_dead_worker_and_stops_all_on_sigterm(tmp_path: Path) -> None:
    supervisor = _supervise("tests.e2e.test_query_processes:_flaky_worker", tmp_path)
    try:
        _wait_for(lambda: _pids(tmp_path, 0) and _pids(tmp_path, 1), 60, "both workers serving")
        (zero,), (one,) = _pids(tmp_path, 0), _pids(tmp_path, 1)
        # worker 0 starts alone and binds first; worker 1 (restarted once) loads before it binds
        assert (tmp_path / f"pid-0-{zero}").read_text() == "True True"
        assert (tmp_path / f"pid-1-{one}").read_text() == "False False"
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=30) == 0
    finally:
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
    log = supervisor.stderr.read() if supervisor.stderr else ""
    assert "query worker 1" in log and "exited with 3; restarting it in 1s" in log
    assert all((tmp_path / f"stopped-{pid}").exists() for pid in (zero, one)), log
    assert "all 2 workers SERVING" in log


def test_beside_a_snapshot_all_workers_start_at_once(tmp_path: Path) -> None:
    (tmp_path / "CURRENT").write_text("snapshot-x\n")  # a snapshot is there: nobody waits for worker 0
    (tmp_path / "started-1").write_text("")  # worker 1 does not die first this time
    supervisor = _supervise("tests.e2e.test_query_processes:_waiting_first_worker", tmp_path)
    try:
        _wait_for(lambda: _pids(tmp_path, 0) and _pids(tmp_path, 1), 60, "both workers serving")
        (zero,), (one,) = _pids(tmp_path, 0), _pids(tmp_path, 1)
        assert (tmp_path / f"pid-0-{zero}").read_text() == "True True"
        assert (tmp_path / f"pid-1-{one}").read_text() == "False False"
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=30) == 0
    finally:
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
    log = supervisor.stderr.read() if supervisor.stderr else ""
    assert "exited" not in log, log


def test_workers_that_keep_dying_stop_the_group_with_exit_1(tmp_path: Path) -> None:
    supervisor = _supervise(
        "tests.e2e.test_query_processes:_crashing_worker", tmp_path, max_deaths=2, death_window_s=60.0
    )
    assert supervisor.wait(timeout=60) == 1
    log = supervisor.stderr.read() if supervisor.stderr else ""
    assert "3 worker deaths within 60s; stopping the group" in log


def test_a_worker_that_refuses_to_start_stops_the_group_with_exit_2(tmp_path: Path) -> None:
    supervisor = _supervise("tests.e2e.test_query_processes:_refusing_worker", tmp_path)
    assert supervisor.wait(timeout=60) == 2
    assert "refused to start (exit 2" in (supervisor.stderr.read() if supervisor.stderr else "")


def test_several_processes_need_a_snapshot_directory(tmp_path: Path) -> None:
    env = service_env({"RAGRPC_QUERY_PROCESSES": "2", "RAGRPC_QUERY_PORT": str(free_port())})
    done = subprocess.run(
        [sys.executable, "-m", "query_service"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert "RAGRPC_QUERY_PROCESSES=2 needs RAGRPC_INDEX_SNAPSHOT_DIR" in done.stderr


def test_a_port_in_use_is_refused_not_shared(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = service_env(
            {
                "RAGRPC_QUERY_PROCESSES": "2",
                "RAGRPC_QUERY_PORT": str(port),
                "RAGRPC_INDEX_SNAPSHOT_DIR": str(tmp_path / "snapshots"),
            }
        )
        done = subprocess.run(
            [sys.executable, "-m", "query_service"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 2
    assert f"RAGRPC_QUERY_PORT {port} on 127.0.0.1 is in use" in done.stderr


# --- the real service -------------------------------------------------------------------------------


class TwoWorkerStack:
    """milvus-lite, the ingest service and a two-worker query service, embedding through a test server."""

    def __init__(self, root: Path, embeddings: EmbeddingsServer) -> None:
        self.milvus = MilvusLiteServer(root / "milvus", free_port())
        (root / "milvus").mkdir(parents=True)
        self.metrics_port = _two_free_ports()
        base = {
            "RAGRPC_MILVUS_URI": self.milvus.uri,
            "RAGRPC_COLLECTION_PREFIX": "workers",
            "RAGRPC_EMBEDDING_PROVIDER": "openai",
            "RAGRPC_EMBEDDING_MODEL": "test-embed",
            "RAGRPC_EMBEDDING_BASE_URL": embeddings.url,
            "RAGRPC_EMBEDDING_MAX_RETRIES": "1",
        }
        self.ingest = ServiceProcess("ingest", "ingest_service", free_port(), service_env({**base}), root)
        self.ingest.env["RAGRPC_INGEST_PORT"] = str(self.ingest.port)
        self.query = ServiceProcess("query", "query_service", free_port(), service_env({**base}), root)
        self.query.env.update(
            {
                "RAGRPC_QUERY_PORT": str(self.query.port),
                "RAGRPC_QUERY_PROCESSES": "2",
                "RAGRPC_INDEX_SNAPSHOT_DIR": str(root / "snapshots"),
                "RAGRPC_QUERY_METRICS_PORT": str(self.metrics_port),
            }
        )
        self.snapshots = root / "snapshots"

    def workers(self) -> dict[int, int]:
        """Worker index -> pid of its latest SERVING line in the log."""
        return {int(i): int(pid) for i, pid in SERVING_LINE.findall(self.query.log_text())}

    def wait_all_serving(self, count_lines: int = 1, timeout_s: float = 180.0) -> dict[int, int]:
        _wait_for(
            lambda: self.query.log_text().count("all 2 workers SERVING") >= count_lines and len(self.workers()) == 2,
            timeout_s,
            "both query workers SERVING",
        )
        return self.workers()

    def retrieve_counts(self) -> list[float]:
        """Each worker's count of finished Retrieve calls, from its own metrics port."""
        counts = []
        for port in (self.metrics_port, self.metrics_port + 1):
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            found = re.findall(r'ragrpc_rpc_requests_total\{[^}]*method="Retrieve"[^}]*\} (\S+)', text)
            counts.append(sum(float(v) for v in found))
        return counts


def _two_free_ports() -> int:
    """A port P with P + 1 free too (the workers' metrics ports)."""
    import socket

    for _ in range(100):
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two free ports in a row")


def _fresh_stub(address: str) -> tuple[grpc.Channel, retrieve_pb2_grpc.RetrieveServiceStub]:
    """A channel with its own connection (no subchannel shared with other channels): SO_REUSEPORT spreads
    connections, so each call on a fresh channel may land on either worker."""
    channel = grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
    return channel, retrieve_pb2_grpc.RetrieveServiceStub(channel)


def _found(address: str, word: str, token: str = "") -> set[str]:
    channel, stub = _fresh_stub(address)
    with channel:
        request = retrieve_pb2.RetrieveRequest(
            query=word,
            consistency_token=token,
            options=retrieve_pb2.RetrievalOptions(top_k=5, mode=retrieve_pb2.RETRIEVAL_MODE_SPARSE),
        )
        return {r.chunk.chunk.document_id for r in stub.Retrieve(request, timeout=30) if r.HasField("chunk")}


def _text(word: str) -> bytes:
    return " ".join(f"Line {i}: the {word} sits on the {word} stone number {i}." for i in range(20)).encode()


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoWorkerStack]:
    root = tmp_path_factory.mktemp("two-workers")
    with EmbeddingsServer(dimension=64) as embeddings:
        stack = TwoWorkerStack(root, embeddings)
        try:
            stack.milvus.start()
            stack.ingest.start()
            for i, word in enumerate(("heron", "crane", "ibis")):
                upload(
                    stack.ingest.address,
                    ingest_pb2.DocumentSpec(document_id=f"doc-{i}", file_name="a.txt"),
                    _text(word),
                )
            stack.query.spawn()
            stack.query.wait_serving(180)
            stack.wait_all_serving()
            yield stack
        finally:
            stack.query.kill(signal.SIGTERM, wait_s=40)
            stack.ingest.kill(signal.SIGTERM, wait_s=20)
            stack.milvus.stop()


@pytest.mark.slow
def test_two_workers_serve_one_port_both_answer_and_the_second_loads_the_snapshot(two_workers: TwoWorkerStack) -> None:
    stack = two_workers
    workers = stack.wait_all_serving()
    assert set(workers) == {0, 1} and workers[0] != workers[1]
    log = stack.query.log_text()
    assert "index snapshot" in log and "written" in log  # worker 0's first snapshot, after its full load
    assert re.search(r"query/1 .*index snapshot \S+ loaded", log), "worker 1 loaded the snapshot"
    assert (stack.snapshots / "CURRENT").exists()
    for _ in range(40):  # forty connections: the kernel gives each to one worker
        assert _found(stack.query.address, "heron") == {"doc-0"}
    zero, one = stack.retrieve_counts()
    assert zero > 0 and one > 0 and zero + one >= 40


@pytest.mark.slow
def test_a_read_your_writes_token_holds_on_every_worker(two_workers: TwoWorkerStack) -> None:
    stack = two_workers
    for round_number in range(3):
        word = f"godwit{round_number}x{int(time.time())}"
        reply = upload(
            stack.ingest.address,
            ingest_pb2.DocumentSpec(document_id=f"ryw-{round_number}", file_name="b.txt"),
            _text(word),
        )
        assert reply.consistency_token
        # at once, on fresh connections (either worker), each answer reflects the write
        for _ in range(8):
            assert _found(stack.query.address, word, reply.consistency_token) == {f"ryw-{round_number}"}


@pytest.mark.slow
def test_a_killed_worker_is_restarted_while_the_other_serves(two_workers: TwoWorkerStack) -> None:
    stack = two_workers
    before = stack.wait_all_serving()
    os.kill(before[1], signal.SIGKILL)
    # once it has exited (until then the kernel may still hand a new connection to its dying socket, which
    # resets it: a client sees UNAVAILABLE and retries), every new connection goes to worker 0
    _wait_for(lambda: "exited with -9" in stack.query.log_text(), 30, "the supervisor saw worker 1 die")
    deadline = time.monotonic() + 120
    answered = 0
    while stack.workers().get(1) == before[1]:  # until the restarted worker 1 says SERVING
        assert time.monotonic() < deadline, stack.query.log_tail()
        assert _found(stack.query.address, "crane") == {"doc-1"}  # worker 0 answers meanwhile
        answered += 1
    assert answered > 0
    after = stack.workers()
    assert after[0] == before[0] and after[1] != before[1]
    assert f"query worker 1 (pid {before[1]}) exited with -9; restarting it" in stack.query.log_text()
    assert health(stack.query.address) == "SERVING"


@pytest.mark.slow
def test_sigterm_to_the_supervisor_stops_every_worker(two_workers: TwoWorkerStack) -> None:
    stack = two_workers
    workers = stack.wait_all_serving()
    assert stack.query.process is not None
    stack.query.process.send_signal(signal.SIGTERM)  # the supervisor alone, as a container runtime sends it
    assert stack.query.process.wait(timeout=60) == 0
    for pid in workers.values():
        _wait_for(lambda pid=pid: not Path(f"/proc/{pid}").exists(), 10, f"worker pid {pid} gone")
    log = stack.query.log_text()
    assert "stopping 2 workers (signal)" in log
    assert log.count("index snapshot") >= 2  # worker 0 wrote its last snapshot on the way out
