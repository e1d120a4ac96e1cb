"""A throwaway ``redis-server`` on a free loopback port (``apt-get install redis-server``)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.servers import free_port, stop


def _wait_ready(port: int, process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(64).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError("redis-server did not start")


@contextmanager
def redis_server() -> Iterator[str]:
    """Run a ``redis-server`` without persistence until the block ends; yields its URL."""
    server = shutil.which("redis-server")
    if server is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    workdir = Path(tempfile.mkdtemp(prefix="lgw-redis-"))
    port = free_port()
    command = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly"]
    command += ["no", "--dir", str(workdir), "--daemonize", "no"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(port, process)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop(process)
        shutil.rmtree(workdir, ignore_errors=True)
