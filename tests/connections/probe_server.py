"""A small app served by :class:`~app.server.GuardedServer` on loopback, in the test's event
loop, with the connection limits a test asks for; raw sockets to talk to it."""

from __future__ import annotations

import asyncio
import faulthandler
import socket
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from app.server import GuardedServer, connection_limits, server_config
from app.settings import Settings
from tests.support.servers import free_port

CHUNK = b"x" * (64 << 10)


@dataclass
class Probe:
    """What the app saw."""

    paths: list[str] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    streams_ended: asyncio.Event = field(default_factory=asyncio.Event)
    held: asyncio.Event = field(default_factory=asyncio.Event)


class Record:
    """Notes each request's path as the app receives it."""

    def __init__(self, app: ASGIApp, probe: Probe) -> None:
        self.app = app
        self.probe = probe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.probe.paths.append(scope["path"])
        await self.app(scope, receive, send)


def probe_app(probe: Probe) -> FastAPI:
    app = FastAPI()
    app.add_middleware(Record, probe=probe)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> dict[str, str]:
        return {"status": "ready"}

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        body = await request.body()
        probe.bodies.append(body)
        return {"bytes": len(body)}

    @app.post("/read-later")
    async def read_later(request: Request) -> dict[str, int]:
        await asyncio.sleep(1.5)  # the body waits, unread, past a window of the rate check
        body = await request.body()
        probe.bodies.append(body)
        return {"bytes": len(body)}

    @app.get("/hold")
    async def hold() -> dict[str, str]:
        await probe.held.wait()
        return {"status": "released"}

    @app.get("/client")
    async def client(request: Request) -> dict[str, str]:
        return {"host": request.client.host if request.client else ""}

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def endless() -> AsyncIterator[bytes]:
            try:
                for _ in range(100_000):  # bounded: 6 GiB, far more than any buffer
                    yield CHUNK
            finally:
                probe.streams_ended.set()

        return StreamingResponse(endless(), media_type="application/octet-stream")

    return app


@dataclass
class Running:
    port: int
    server: GuardedServer
    probe: Probe

    async def connect(
        self, *, source: str = "127.0.0.1", receive_buffer: int | None = None
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        sock = socket.socket()
        if receive_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.bind((source, 0))
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", self.port))
        return await asyncio.open_connection(sock=sock)

    async def open_count_reaches(self, count: int) -> None:
        """Wait (up to 5 s) until the server counts ``count`` open connections."""
        if self.server.guard is None:  # a server without limits counts nothing: give it time
            await asyncio.sleep(0.2)
            return
        for _ in range(500):
            if self.server.guard is not None and self.server.guard.open == count:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"the server did not come to {count} open connections")

    async def exchange(self, raw: bytes, *, source: str = "127.0.0.1") -> tuple[bytes, bool]:
        """Send ``raw`` on a new connection: what came back, and whether it was closed."""
        reader, writer = await self.connect(source=source)
        try:
            writer.write(raw)
            return await read_until_closed(reader)
        finally:
            writer.close()


async def read_until_closed(
    reader: asyncio.StreamReader, timeout: float = 5.0
) -> tuple[bytes, bool]:
    """What ``reader`` receives until its connection closes (True) or ``timeout`` passes."""
    received = b""
    deadline = asyncio.get_running_loop().time() + timeout
    try:
        while chunk := await asyncio.wait_for(
            reader.read(65536), deadline - asyncio.get_running_loop().time()
        ):
            received += chunk
    except asyncio.TimeoutError:
        return received, False
    except ConnectionResetError:
        pass
    return received, True


async def send_until_answered(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    pieces: Iterable[bytes],
    pause: float,
) -> tuple[bytes, bool]:
    """Send ``pieces``, ``pause`` seconds apart, until the server answers (past that, what
    the client sent may reset the connection before it reads the answer); then read until
    the connection closes: what came back, and whether it was closed."""
    first = asyncio.ensure_future(reader.read(65536))
    for piece in pieces:
        if first.done():
            break
        try:
            writer.write(piece)
            await writer.drain()
        except ConnectionError:
            break
        await asyncio.wait([first], timeout=pause)
    try:
        head = await asyncio.wait_for(first, 60)  # bounds a hang only
    except ConnectionResetError:
        return b"", True
    if not head:
        return b"", True
    rest, closed = await read_until_closed(reader)
    return head + rest, closed


def status_of(response: bytes) -> int | None:
    line = response.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) > 1 and line[0].startswith(b"HTTP/") else None


@asynccontextmanager
async def serving(**overrides: Any) -> AsyncIterator[Running]:
    """The probe app behind a GuardedServer with these settings (defaults otherwise)."""
    settings = Settings(
        _env_file=None,
        port=free_port(),
        log_level="warning",
        **overrides,
    )
    probe = Probe()
    app = probe_app(probe)
    server = GuardedServer(server_config(app, settings), limits=connection_limits(settings))
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(500):
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        assert server.started, "the server did not start"
        yield Running(settings.port, server, probe)
    finally:
        server.should_exit = True
        await task
        # GuardedServer's exit deadline is for a process that ends with it; this one goes on.
        faulthandler.cancel_dump_traceback_later()
