"""The concurrency bench's count of how the callers' connections split over the service's processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from scripts.bench.concurrency import connections_by_process


def test_connections_to_a_port_are_counted_for_the_process_that_accepted_them() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        accepted = [listener.accept()[0] for _ in clients]
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            # the clients' own sockets have ephemeral local ports: only the accepted ends count
            assert connections_by_process([os.getpid(), other.pid], port) == {os.getpid(): 3}
            accepted.pop().close()
            clients.pop().close()
            assert connections_by_process([os.getpid()], port) == {os.getpid(): 2}
        finally:
            other.kill()
            other.wait()
            for sock in clients + accepted:
                sock.close()
