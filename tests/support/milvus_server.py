"""Starts a real `milvus-lite server` process on a free 127.0.0.1 port for tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.3)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class MilvusLiteServer:
    data_dir: Path
    port: int
    process: subprocess.Popen | None = None
    answer_limit_bytes: int | None = None  # milvus-lite's gRPC message limit (256 MB) lowered, for tests

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> MilvusLiteServer:
        executable = [str(Path(sys.executable).with_name("milvus-lite"))]
        if self.answer_limit_bytes is not None:  # the same server, its module's limit set before it starts
            executable = [
                sys.executable,
                "-c",
                "import sys, milvus_lite.adapter.grpc.server as s; "
                f"s._MAX_MESSAGE_SIZE = {int(self.answer_limit_bytes)}; "
                "from milvus_lite.cmdline import main; sys.exit(main(sys.argv[1:]))",
            ]
        log = open(self.data_dir.parent / f"milvus-{self.port}.log", "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                *executable,
                "server",
                "--data-dir",
                str(self.data_dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while not _port_open(self.port):
            if self.process.poll() is not None:
                raise RuntimeError(f"milvus-lite server exited with {self.process.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError("milvus-lite server did not start in time")
            time.sleep(0.2)
        return self

    def stop(self, kill: bool = False) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


def start_milvus_lite(
    tmp_dir: Path, port: int | None = None, answer_limit_bytes: int | None = None
) -> MilvusLiteServer:
    data = tmp_dir / "milvus"
    data.mkdir(parents=True, exist_ok=True)
    return MilvusLiteServer(data, port or free_port(), answer_limit_bytes=answer_limit_bytes).start()
