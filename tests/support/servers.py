"""The servers tests start: their loopback ports (:func:`free_port`, the tools' own), waiting
for them to be ready, stopping them; uvicorn's server as the tests run it
(:class:`PromptServer`)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from contextlib import ExitStack, asynccontextmanager, suppress

import httpx
import uvicorn

from tools.gateway_cost.ports import free_port as free_port  # the tools' own, held ports


def wait_until_ready(
    url: str, *, alive: Callable[[], bool], timeout: float, http: httpx.Client | None = None
) -> None:
    """Poll ``url`` (through ``http``) until it answers 200; fail as soon as ``alive()`` is
    false (the server stopped) or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    with ExitStack() as opened:
        client = http or opened.enter_context(httpx.Client())
        while True:
            try:
                if client.get(url).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert alive(), f"the server for {url} stopped before it was ready"
            assert time.monotonic() < deadline, f"{url} did not answer 200 within {timeout} s"
            time.sleep(0.02)


def stop(process: subprocess.Popen[bytes], timeout: float = 5) -> None:
    """SIGTERM, then SIGKILL if ``process`` has not exited within ``timeout`` seconds."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class PromptServer(uvicorn.Server):
    """uvicorn's server as the tests run it: it stops as soon as it is told (``should_exit``,
    from any thread), where uvicorn's own notices at its next tick, up to a tenth of a second
    later; and its shutdown waits for the connections and the requests' tasks to end as
    uvicorn's does, but sees them end within milliseconds, where uvicorn's pauses a tenth of a
    second first and then looks every tenth. A test process starts and stops hundreds of
    servers: those pauses were a large part of the fast layer's wall time."""

    POLL_SECONDS = 0.005

    def __init__(self, config: uvicorn.Config) -> None:
        self._told: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        super().__init__(config)

    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        if value and self._told is not None:
            loop, told = self._told
            with suppress(RuntimeError):  # the loop is closed: the server is long gone
                loop.call_soon_threadsafe(told.set)

    async def main_loop(self) -> None:
        """uvicorn's, each tick's wait cut short when the server is told to exit."""
        told = asyncio.Event()
        self._told = (asyncio.get_running_loop(), told)
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            with suppress(TimeoutError):
                async with asyncio.timeout(0.1):
                    await told.wait()
            should_exit = await self.on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's (uvicorn/server.py), its waits polled every few milliseconds."""
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        state = self.server_state
        try:
            async with asyncio.timeout(self.config.timeout_graceful_shutdown):
                while (state.connections or state.tasks) and not self.force_exit:
                    await asyncio.sleep(self.POLL_SECONDS)
                for server in self.servers:
                    await server.wait_closed()
        except TimeoutError:
            for task in state.tasks:
                task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
        if not self.force_exit:
            await self.lifespan.shutdown()


# What PostgreSQL answers every connection while it starts up or recovers after a crash: an
# ErrorResponse, SQLSTATE 57P03.
_STARTING_UP = b"SFATAL\0VFATAL\0C57P03\0Mthe database system is starting up\0\0"
_ENCRYPTION_REQUESTS = (80877103, 80877104)  # SSLRequest, GSSENCRequest: answered "no"


@asynccontextmanager
async def postgres_starting_up() -> AsyncIterator[str]:
    """A loopback server that speaks PostgreSQL's protocol just far enough to refuse every
    connection as "starting up"; yields an asyncpg URL for it."""

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                length = int.from_bytes(await reader.readexactly(4), "big")
                code = int.from_bytes((await reader.readexactly(length - 4))[:4], "big")
                if code not in _ENCRYPTION_REQUESTS:
                    break
                writer.write(b"N")
            writer.write(b"E" + (len(_STARTING_UP) + 4).to_bytes(4, "big") + _STARTING_UP)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}/postgres"
