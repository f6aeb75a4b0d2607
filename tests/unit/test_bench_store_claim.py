"""A bench store directory is claimed by one run at a time (scripts/bench/scale.py, claim_directory): a second
run is refused before it touches the directory or the server on it, and a claim ends with its holder, however
that ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.bench.scale import Backend, claim_directory
from scripts.processes import REPO


def test_a_second_run_is_refused_and_the_directory_left_as_it_was(tmp_path: Path) -> None:
    root = tmp_path / "milvus-2.3.5-1000"
    root.mkdir()
    (root / "ports.json").write_text('{"proxy_port": 1}')  # ports a start would find taken: it would rebuild
    claim = claim_directory(root)
    try:
        for kind in ("milvus-2.3.5", "milvus-lite"):
            with pytest.raises(RuntimeError, match=rf"in use by another run \(pid {os.getpid()}\)"):
                Backend(kind, root).start()
        assert (root / "ports.json").read_text() == '{"proxy_port": 1}'
    finally:
        claim.close()
    claim_directory(root).close()  # free again once its holder let go


def test_a_claim_ends_with_a_holder_that_is_killed(tmp_path: Path) -> None:
    root = tmp_path / "milvus-lite-1000"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from scripts.bench.scale import claim_directory; "
            "claim = claim_directory(Path(sys.argv[1])); print('claimed', flush=True); time.sleep(600)",
            str(root),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "claimed"
        with pytest.raises(RuntimeError, match=rf"pid {holder.pid}\)"):
            claim_directory(root)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    deadline = time.monotonic() + 10
    while True:
        try:
            claim_directory(root).close()
            break
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
