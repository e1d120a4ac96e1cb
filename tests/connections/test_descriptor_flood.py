"""The incident of issue #23: 1,100 connections trickling a request line held every
descriptor of a gateway with systemd's default limit (1,024), and /healthz failed for as long
as they stayed open. The same flood, against the real server process, now leaves it healthy."""

from __future__ import annotations

import contextlib
import resource
import socket
import subprocess
import sys
import textwrap

import httpx

from tests.support.servers import free_port, stop, wait_until_ready

SERVER = textwrap.dedent(
    """
    import resource, sys
    from fastapi import FastAPI
    from app import server
    from app.settings import Settings

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # systemd's default soft limit
    app = FastAPI()

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    server.run(app, Settings(_env_file=None, port=int(sys.argv[1]), log_level="error"))
    """
)
FLOOD = 1_100


def answered_429(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(64).startswith(b"HTTP/1.1 429 ")
    except OSError:  # nothing came (still open), or reset
        return False


def test_a_flood_of_trickling_connections_leaves_healthz_answering() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = FLOOD + 256
    if soft < needed:  # this process holds the flood's client ends
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))
    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", SERVER, str(port)])
    flood: list[socket.socket] = []
    try:
        url = f"http://127.0.0.1:{port}/healthz"
        wait_until_ready(url, alive=lambda: process.poll() is None, timeout=60)
        for _ in range(FLOOD):
            sock = socket.socket()
            flood.append(sock)
            sock.settimeout(5)
            sock.bind(("127.0.0.2", 0))  # the flood's source; the probe comes from 127.0.0.1
            with contextlib.suppress(OSError):  # refused ones may be reset already
                sock.connect(("127.0.0.1", port))
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Trickle: a")
        # Well inside the 10 s the flood's heads have: the flood's connections are still open.
        response = httpx.get(url, timeout=5)
        assert response.status_code == 200
        assert process.poll() is None
        # The flood beyond its source's cap (256) was refused with 429 as it came.
        assert sum(answered_429(sock) for sock in flood) >= FLOOD - 256
    finally:
        for sock in flood:
            sock.close()
        stop(process)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
