"""A TCP proxy on loopback that adds latency, to lose a Redis reply after the script ran (or
to land a command after its client gave up), as a slow network or a slow Redis would."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable


class LatencyProxy:
    """Forwards connections to ``port`` on loopback. Each chunk is held for the delay of its
    direction as it was when the chunk arrived (``request_delay`` towards Redis,
    ``reply_delay`` back), in order: changing a delay does not reorder what is in flight."""

    def __init__(self, port: int) -> None:
        self.target_port = port
        self.request_delay = 0.0
        self.reply_delay = 0.0
        self.in_flight = 0
        """Chunks received and not yet forwarded, in either direction."""
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        """Start listening; the port to connect to."""
        self._server = await asyncio.start_server(self._connected, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def settled(self, timeout: float = 10.0) -> None:
        """Wait until nothing is held (every delayed chunk has been forwarded)."""
        async with asyncio.timeout(timeout):
            while self.in_flight:
                await asyncio.sleep(0.01)

    async def _connected(
        self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
    ) -> None:
        redis_r, redis_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        for source, sink, delay in (
            (client_r, redis_w, lambda: self.request_delay),
            (redis_r, client_w, lambda: self.reply_delay),
        ):
            pipe = asyncio.create_task(self._pipe(source, sink, delay))
            self._pipes.add(pipe)
            pipe.add_done_callback(self._pipes.discard)

    async def _pipe(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, delay: Callable[[], float]
    ) -> None:
        loop = asyncio.get_running_loop()
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def forward() -> None:
            while True:
                due, chunk = await held.get()
                await asyncio.sleep(max(0.0, due - loop.time()))
                self.in_flight -= 1
                if not chunk:
                    break
                sink.write(chunk)
                await sink.drain()

        forwarding = asyncio.create_task(forward())
        try:
            while True:
                chunk = await source.read(65536)
                self.in_flight += 1
                held.put_nowait((loop.time() + delay(), chunk))
                if not chunk:  # the sender closed: close this side after what it sent
                    break
            await forwarding
        except ConnectionError:
            pass
        finally:
            forwarding.cancel()
            with contextlib.suppress(ConnectionError, RuntimeError):
                sink.close()
