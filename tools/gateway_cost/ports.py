"""Loopback ports for the measured servers: light to import, so that a server process that
needs only these (the floor's apps) does not load the gateway."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def wait_for_port(process: subprocess.Popen[bytes], port: int, seconds: float, what: str) -> None:
    """Until ``process`` accepts connections on ``port``; ``what`` did not start if it exits
    first or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while True:
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), 1):
            return
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.1)
