"""Starts a real Milvus 2.3.5 standalone server from PyPI's `milvus` package (no Docker) on free
127.0.0.1 ports, for the reliability tests and the scale bench. It opens its other ports on
0.0.0.0 too (all chosen free here) and leaves a child behind on SIGTERM, so stop() kills its
whole process group."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.milvus_server import free_port

PORT_OPTIONS = (
    "proxy_port",
    "etcd_port",
    "root_coord_port",
    "proxy_internal_port",
    "query_coord_port",
    "query_node_port",
    "index_coord_port",
    "index_node_port",
    "data_coord_port",
    "data_node_port",
)


def milvus_server_executable() -> tuple[str | None, str]:
    try:
        import milvus  # noqa: F401
    except ImportError:
        return None, (
            "the `milvus` package (Milvus 2.3.5 server from PyPI) is not installed: "
            "`.venv/bin/pip install milvus==2.3.5` to run the tests against a real Milvus server"
        )
    executable = Path(sys.executable).with_name("milvus-server")
    if not executable.exists():
        found = shutil.which("milvus-server")
        if not found:
            return None, "the `milvus` package is installed but its `milvus-server` entry point was not found"
        executable = Path(found)
    return str(executable), ""


def ports_free(ports: dict[str, int], wait_s: float = 60.0) -> bool:
    """True when every port of an earlier server can be listened on again (with SO_REUSEADDR, as the
    server's own listeners: connections of its last run left in TIME_WAIT do not count), waiting up
    to `wait_s` for one that is still held."""
    return not _held_after(list(ports.values()), wait_s, reuse_address=True)


TIME_WAIT_S = 60.0  # Linux keeps a closed TCP connection's port in TIME_WAIT this long


def wait_until_wrapper_can_bind(ports: list[int], timeout_s: float) -> None:
    """Waits until `milvus-server` can take each of `ports`. The wrapper tries each port it is given with
    a plain bind (no SO_REUSEADDR) and, where that fails, silently takes the next free port and writes
    that into the server's configuration. For about a minute after a server that had clients stops, its
    proxy port is held by connections in TIME_WAIT: the plain bind fails, the server listened one port
    up, and a start waiting on the port it asked for waited until its deadline (10 minutes in the scale
    bench, 2026-12-07). RuntimeError naming the ports still held after `timeout_s`."""
    held = _held_after(ports, timeout_s, reuse_address=False)
    if held:
        raise RuntimeError(
            f"ports {held} are still held after {timeout_s:.0f}s (milvus-server would move to other ports)"
        )


def _held_after(ports: list[int], wait_s: float, *, reuse_address: bool) -> list[int]:
    """The ports still not bindable (`_bindable`) after waiting up to `wait_s` for them all."""
    deadline = time.monotonic() + wait_s
    while True:
        held = [port for port in ports if not _bindable(port, reuse_address=reuse_address)]
        if not held or time.monotonic() > deadline:
            return held
        time.sleep(1.0)


def stop_leftovers(root: Path) -> list[int]:
    """Kills what is left of an earlier server on `root`'s data directory (its `milvus-server` wrapper or
    its `milvus run standalone`, found by the directory in their command lines: a run that was killed
    before it could stop them) and returns their pids; waits until they are gone."""
    data = str((root / "data").resolve())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if data in command and "milvus" in command:
            found.append(int(entry.name))
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline and any(_running(pid) for pid in found):
        time.sleep(0.2)
    return found


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed child of a parent that never waits for it stays one)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _bindable(port: int, reuse_address: bool = True) -> bool:
    """Whether a listener could bind `port`: with SO_REUSEADDR on 0.0.0.0, as the server's own listeners
    bind, or (reuse_address=False) with a plain bind on 127.0.0.1, as the `milvus-server` wrapper tries it."""
    with socket.socket() as sock:
        if reuse_address:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0" if reuse_address else "127.0.0.1", port))
        except OSError:
            return False
    return True


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class Milvus235:
    """`ports`: the ports of an earlier server on the same data directory (its metadata names them, so
    a data directory survives a restart only on the same ports); None: free ones."""

    def __init__(self, executable: str, root: Path, ports: dict[str, int] | None = None) -> None:
        self.executable = executable
        self.root = root
        self.ports = dict(ports) if ports else {name: free_port() for name in PORT_OPTIONS}
        self.process: subprocess.Popen[bytes] | None = None
        self.log = root / "milvus-server.log"

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.ports['proxy_port']}"

    def start(self, timeout_s: float = 240.0) -> float:
        """Starts the server and waits until it answers; a start that fails or times out stops what it
        started (a server left running would hold this data directory's ports for the next start)."""
        try:
            return self._start(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout_s: float) -> float:
        started = time.monotonic()
        wait_until_wrapper_can_bind(list(self.ports.values()), min(timeout_s, TIME_WAIT_S + 30.0))
        command = [self.executable, "--data", str(self.root / "data")]
        for name, port in self.ports.items():
            command += [f"--{name.replace('_', '-')}", str(port)]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.root
            )
        from ragrpc.store.milvus_connection import MilvusConnection

        deadline = time.monotonic() + timeout_s
        while not _port_open(self.ports["proxy_port"]):
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"milvus-server exited with {self.process.returncode}: {self.log.read_text()[-2000:]}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError("milvus-server did not open its proxy port in time")
            time.sleep(0.5)
        connection = MilvusConnection(self.uri, timeout_s=30)
        connection.wait_until_ready(max(10.0, deadline - time.monotonic()))
        version = connection.call(lambda c: c.get_server_version())
        connection.reset()
        if not str(version).startswith("v2.3"):  # another server took the port while this one started
            raise RuntimeError(f"{self.uri} answers as {version!r}, not this Milvus 2.3.5 server: its port was taken")
        print(
            f"\n[milvus 2.3.5] server version {version} on {self.uri} (pid {self.process.pid}), "
            f"started in {time.monotonic() - started:.1f}s"
        )
        return time.monotonic() - started

    def stop(self) -> None:
        if self.process is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):  # SIGTERM alone leaves `milvus run standalone` behind
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # the child, whatever the parent did
        except ProcessLookupError:
            pass


@contextlib.contextmanager
def running_or_skipped(root: Path, label: str) -> Iterator[Milvus235]:
    """A test fixture's server: started on free ports under `root`, stopped at the end; when the `milvus`
    package is not installed the test is skipped, printing why under `label`."""
    import pytest  # only tests call this; the scale bench imports the module without pytest's help

    executable, reason = milvus_server_executable()
    if executable is None:
        print(f"\nSKIP {label}: {reason}")
        pytest.skip(reason)
    server = Milvus235(executable, root)
    try:
        server.start()
        yield server
    finally:
        server.stop()
