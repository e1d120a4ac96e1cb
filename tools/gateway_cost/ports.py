"""Loopback ports for the servers the tools and the tests start: light to import, so that a
server process that needs only these (the floor's apps) does not load the gateway."""

from __future__ import annotations

import atexit
import contextlib
import socket
import subprocess
import time
from collections import deque

HOST = "127.0.0.1"


# How many of the ports free_port handed out lately stay held: long enough for each server
# to bind its own (an app's start-up, a process's), few enough to leave descriptors spare.
HELD_PORTS = 64
_held: deque[socket.socket] = deque()


def free_port() -> int:
    """A loopback port nothing listens on now, held until the server it is for binds it.

    The OS picks it (a bind to port 0), and it stays bound (SO_REUSEADDR, never listening)
    until :data:`HELD_PORTS` more have been handed out in this process. Linux lets a server
    that sets SO_REUSEADDR (uvicorn, asyncio's and Python's servers, Redis, PostgreSQL,
    vLLM: every one started here and in the tests) bind and listen on it meanwhile, while no
    other bind to port 0 is given it, and no connection takes it as its own port. Released at
    once, the port could be given to another process (another test worker's free_port, or a
    connection) before the server, which binds only once started (a second or more for a
    process), took it: the second server would fail to bind, or a client reach another's."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))
    port: int = sock.getsockname()[1]
    _held.append(sock)
    while len(_held) > HELD_PORTS:
        with contextlib.suppress(IndexError):  # another thread took the oldest first
            _held.popleft().close()
    return port


@atexit.register
def _release_held_ports() -> None:
    while _held:
        _held.pop().close()


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
