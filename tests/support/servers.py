"""Loopback ports for the servers tests start, waiting for them to be ready, stopping them."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable

import httpx


def free_port() -> int:
    """A port nothing listens on now (the OS picks it; free until someone binds it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until_ready(
    url: str, *, alive: Callable[[], bool], timeout: float, http: httpx.Client | None = None
) -> None:
    """Poll ``url`` (through ``http``) until it answers 200; fail as soon as ``alive()`` is
    false (the server stopped) or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if (http or httpx).get(url).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert alive(), f"the server for {url} stopped before it was ready"
        assert time.monotonic() < deadline, f"{url} did not answer 200 within {timeout} s"
        time.sleep(0.2)


def stop(process: subprocess.Popen[bytes], timeout: float = 5) -> None:
    """SIGTERM, then SIGKILL if ``process`` has not exited within ``timeout`` seconds."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
