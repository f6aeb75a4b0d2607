"""The `ragrpc` CLI as a real process whose output is piped into a reader that closes early
(`ragrpc --json search ... | head -1`): it ends quietly, as Unix tools do on SIGPIPE, with no
traceback and exit code 141, whether Python buffers its stdout or not (PYTHONUNBUFFERED)."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from clients.cli import EXIT_OUTPUT_CLOSED, main

REPO_ROOT = Path(__file__).resolve().parents[2]
PIPE_BYTES = 4096  # the pipe's capacity, lowered so the output cannot fit in it (Linux: F_SETPIPE_SZ)
WORDS = (
    "river harbour meadow granite lantern orchard copper valley signal ledger beacon willow canyon "
    "thunder compass glacier quarry saddle timber falcon marble cellar pepper anchor bramble"
).split()


def _long_document(paragraphs: int = 150) -> str:
    """Distinct paragraphs of about a chunk each, so a search has well over 100 hits to print."""
    rng = random.Random(45)
    return "\n\n".join(
        f"Section {i}. " + " ".join(rng.choice(WORDS) for _ in range(150)) + "." for i in range(paragraphs)
    )


def _read_line(fd: int) -> bytes:
    """What `head -1` reads: bytes up to the first newline (in small reads, so little more)."""
    line = b""
    while not line.endswith(b"\n"):
        piece = os.read(fd, 256)
        if not piece:
            break
        line += piece
    return line.split(b"\n", 1)[0]


def _cli_env(unbuffered: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return {**env, "PYTHONUNBUFFERED": "1"} if unbuffered else env


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
async def test_search_into_a_reader_that_closes_after_one_line(fake_stack, tmp_path: Path, unbuffered: bool) -> None:
    (tmp_path / "long.txt").write_text(_long_document())
    ingested = await asyncio.to_thread(main, ["--ingest", fake_stack.ingest_address, "ingest", str(tmp_path)])
    assert ingested == 0
    await fake_stack.followed()

    read_end, write_end = os.pipe()
    if hasattr(fcntl, "F_SETPIPE_SZ"):
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    argv = ["--query", fake_stack.query_address, "--json", "search", "river harbour", "--top-k", "100"]
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "clients.cli",
        *argv,
        stdout=write_end,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO_ROOT,
        env=_cli_env(unbuffered),
    )
    os.close(write_end)
    try:
        first = await asyncio.to_thread(_read_line, read_end)
    finally:
        os.close(read_end)  # the reader leaves, as head does after its line
    stderr = await process.stderr.read()  # type: ignore[union-attr]
    code = await asyncio.wait_for(process.wait(), timeout=60)

    assert json.loads(first)["type"] == "hit"
    assert stderr.decode() == ""  # no traceback, no "Exception ignored", no error line
    assert code == EXIT_OUTPUT_CLOSED == 141


async def test_the_whole_output_is_far_larger_than_the_pipe(fake_stack, tmp_path: Path, capsys) -> None:
    """The premise of the test above: the search prints far more than the pipe and Python's buffer
    hold, so the reader closes while the CLI still has output to write."""
    (tmp_path / "long.txt").write_text(_long_document())
    assert await asyncio.to_thread(main, ["--ingest", fake_stack.ingest_address, "ingest", str(tmp_path)]) == 0
    await fake_stack.followed()
    capsys.readouterr()
    argv = ["--query", fake_stack.query_address, "--json", "search", "river harbour", "--top-k", "100"]
    assert await asyncio.to_thread(main, argv) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 101 and len(out.encode()) > 10 * (PIPE_BYTES + 8192)


def test_help_into_a_closed_pipe_exits_quietly() -> None:
    """`ragrpc --help | true`: the reader is gone before the first byte (stdout buffered, as in a
    user's shell: the help reaches the pipe at main's flush)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "clients.cli", "--help"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            cwd=REPO_ROOT,
            env=_cli_env(unbuffered=False),
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert done.stderr.decode() == ""
    assert done.returncode == EXIT_OUTPUT_CLOSED
