"""The Milvus 2.3.5 test server's own housekeeping (tests/support/milvus235.py): a failed start stops what
it started, a server an earlier run left on a data directory is found and stopped, not wiped with it, and a
start waits for the ports the `milvus-server` wrapper would not take yet."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.milvus235 import Milvus235, _bindable, stop_leftovers, wait_until_wrapper_can_bind


def _sleeper(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *args], start_new_session=True)


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_leftover_of_the_data_directory_is_stopped_and_others_are_left_alone(tmp_path: Path) -> None:
    ours = _sleeper("milvus-server", "--data", str(tmp_path / "a" / "data"))
    other = _sleeper("milvus-server", "--data", str(tmp_path / "b" / "data"))
    try:
        time.sleep(0.3)
        assert stop_leftovers(tmp_path / "a") == [ours.pid]
        ours.wait(timeout=10)
        assert _gone(ours.pid) and other.poll() is None
        assert stop_leftovers(tmp_path / "a") == []
    finally:
        for process in (ours, other):
            process.kill()
            process.wait()


def test_a_start_that_times_out_stops_the_process_it_started(tmp_path: Path) -> None:
    fake = tmp_path / "milvus-server"  # a server that never opens its proxy port
    fake.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(120)\n")
    fake.chmod(0o755)
    server = Milvus235(str(fake), tmp_path)
    with pytest.raises(RuntimeError, match="did not open its proxy port"):
        server.start(timeout_s=1.0)
    assert server.process is not None
    assert server.process.poll() is not None  # stopped and waited for
    with pytest.raises(ProcessLookupError):
        os.killpg(server.process.pid, 0)


def _port_in_time_wait() -> int:
    """A port whose last connection the listening side closed first: it stays in TIME_WAIT for a minute. The
    listener sets SO_REUSEADDR, as the server's (Go's) listeners do: only then may another listener with
    SO_REUSEADDR bind the port over the connection in TIME_WAIT."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    accepted.close()  # the server's side closes first: its end goes to TIME_WAIT
    listener.close()
    client.recv(1)
    client.close()
    deadline = time.monotonic() + 10.0
    while not _bindable(port) and time.monotonic() < deadline:  # FIN_WAIT_2 until the client's close arrives
        time.sleep(0.05)
    return port


def test_a_start_waits_for_ports_that_the_wrapper_could_not_take_yet(tmp_path: Path) -> None:
    """milvus-server binds each port it is given without SO_REUSEADDR and moves to another one where that
    fails; a port in TIME_WAIT is such a port, though a listener with SO_REUSEADDR could take it. A start
    waits for it (here until its own short deadline) instead of starting a server on other ports."""
    port = _port_in_time_wait()
    assert _bindable(port) and not _bindable(port, reuse_address=False)
    with pytest.raises(RuntimeError, match=rf"ports \[{port}\] are still held"):
        wait_until_wrapper_can_bind([port], timeout_s=0.5)
    fake = tmp_path / "milvus-server"
    fake.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(120)\n")
    fake.chmod(0o755)
    server = Milvus235(str(fake), tmp_path, {"proxy_port": port})
    with pytest.raises(RuntimeError, match="are still held"):
        server.start(timeout_s=1.0)
    assert server.process is None  # nothing was started on other ports


def test_a_port_let_go_is_waited_for_and_taken(tmp_path: Path) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    timer = threading.Timer(1.0, holder.close)
    timer.start()
    started = time.monotonic()
    wait_until_wrapper_can_bind([port], timeout_s=30.0)
    assert time.monotonic() - started >= 0.9  # not before the holder let go
    assert _bindable(port, reuse_address=False)
    timer.join()
