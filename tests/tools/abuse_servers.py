"""Tiny loopback servers with one scripted behaviour each, for the abuse suite's tests: what
the client side makes of a reply, a close, a reset, silence."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def reply(status: int, body: bytes = b"{}") -> bytes:
    return (
        f"HTTP/1.1 {status} Whatever\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[int]:
    """Serve ``handler`` on a free loopback port (bound on all of 127.0.0.0/8's addresses
    that route to it: the attackers send from 127.0.0.2); the port."""

    async def guarded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(guarded, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def read_head(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


def answering(status: int) -> Handler:
    """Reads the request head, answers ``status`` and closes (the body unread)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(reply(status))
        await writer.drain()

    return handle


async def closing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Reads the head and closes without a word."""
    await read_head(reader)


async def resetting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Reads the head and resets the connection (SO_LINGER 0, then close)."""
    await read_head(reader)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Never answers; reads until the client leaves."""
    while await reader.read(1 << 16):
        pass
