"""The Milvus 2.3.5 test server's own housekeeping (tests/support/milvus235.py): a failed start stops what
it started, and a server an earlier run left on a data directory is found and stopped, not wiped with it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.milvus235 import Milvus235, stop_leftovers


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
