"""HTTP/1.1 over a fresh loopback connection, written by hand: the attacks need what a client
library will not do (trickle a request line, send a body the server has already answered,
stop reading a response), and the victim is timed the same way, so that both sides pay the
same client cost.

Every request says ``Connection: close``: a reply is read to the end of the connection, and
only its status line is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from dataclasses import dataclass
from typing import Any

HOST = "127.0.0.1"
KEPT_REPLY_BYTES = 4096
"""What is kept of a reply: enough for its status line (the rest is read and dropped)."""

CONNECT_FAILED = "connect-failed"
CLOSED = "closed"  # the server closed the connection without answering
RESET = "reset"
TIMEOUT = "timeout"


@dataclass(frozen=True)
class Reply:
    """How one exchange ended: the HTTP status as text (``"200"``, ``"429"``), or one of the
    connection outcomes above; and the seconds from the connect to the end."""

    outcome: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.outcome == "200"


def http_request(
    method: str,
    path: str,
    *,
    port: int,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    declared_length: int | None = None,
) -> bytes:
    """The request's bytes; ``declared_length`` is the Content-Length to declare when the
    body sent here is not all of it (the rest is to be trickled)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {HOST}:{port}", "Connection: close"]
    if declared_length is not None or body or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body) if declared_length is None else declared_length}")
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def json_post(path: str, payload: dict[str, Any] | bytes, *, port: int, key: str | None) -> bytes:
    """A POST of ``payload`` (a dict, or JSON already encoded: the large bodies are built
    once), with ``key`` as its bearer token."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return http_request("POST", path, port=port, body=body, headers=headers)


def status_of(head: bytes) -> str | None:
    """``b"HTTP/1.1 429 Too Many..."`` -> ``"429"``; None while the status is incomplete or
    for what is not an HTTP response."""
    if not head.startswith(b"HTTP/1."):
        return None
    parts = head.split(b" ", 2)
    if len(parts) < 3 or len(parts[1]) != 3 or not parts[1].isdigit():
        return None
    return parts[1].decode()


async def connect(
    port: int, *, source: str | None = None, receive_buffer: int | None = None, limit: int = 1 << 16
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the gateway from ``source`` (another loopback address: the attacker is
    another client than the victim, as it would be); ``receive_buffer`` shrinks the socket's
    receive buffer, and ``limit`` the reader's, for a client that stops reading."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        if receive_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        if source is not None:
            sock.bind((source, 0))
        await loop.sock_connect(sock, (HOST, port))
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock, limit=limit)


async def exchange(
    request: bytes, *, port: int, timeout: float, source: str | None = None
) -> Reply:
    """Send ``request`` on a new connection while reading the reply (a server may answer,
    and close, before a large body is all sent) to the connection's end."""
    started = time.monotonic()
    try:
        outcome = await asyncio.wait_for(_exchange(request, port, source), timeout)
    except asyncio.TimeoutError:
        outcome = TIMEOUT
    return Reply(outcome, time.monotonic() - started)


async def _exchange(request: bytes, port: int, source: str | None) -> str:
    try:
        reader, writer = await connect(port, source=source)
    except OSError:
        return CONNECT_FAILED
    sending = asyncio.create_task(_send(writer, request))
    try:
        kept, error = await read_to_end(reader)
    finally:
        sending.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await sending
        writer.close()
    return status_of(kept) or (RESET if error else CLOSED)


async def _send(writer: asyncio.StreamWriter, data: bytes) -> None:
    # The server may close first (an early 413 or 429): the reply says how it ended.
    with contextlib.suppress(OSError):
        writer.write(data)
        await writer.drain()


async def read_to_end(reader: asyncio.StreamReader) -> tuple[bytes, bool]:
    """The reply's first bytes, and whether the connection was reset (not closed)."""
    kept = bytearray()
    try:
        while chunk := await reader.read(1 << 16):
            if len(kept) < KEPT_REPLY_BYTES:
                kept += chunk[: KEPT_REPLY_BYTES - len(kept)]
    except (ConnectionResetError, BrokenPipeError):
        return bytes(kept), True
    return bytes(kept), False
