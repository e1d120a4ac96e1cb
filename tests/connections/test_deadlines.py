"""A request's head and body must arrive in time, and its response must be read in time."""

from __future__ import annotations

import asyncio
import json
import socket
import time

from app import metrics
from tests.connections.probe_server import (
    read_until_closed,
    send_until_answered,
    serving,
    status_of,
)

FAST = {"request_head_timeout_seconds": 0.5}


def refused(reason: str) -> float:
    return float(metrics.CONNECTIONS_REFUSED.labels(reason)._value.get())


async def test_a_request_head_not_complete_in_time_is_answered_408_and_closed() -> None:
    before = refused("head_timeout")
    async with serving(**FAST) as running:
        reader, writer = await running.connect()
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow")  # and nothing more
        started = time.monotonic()
        response, closed = await read_until_closed(reader, timeout=9)
        writer.close()
    assert closed and status_of(response) == 408
    assert json.loads(response.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
    # The configured 0.5 s, not the default 10 s: slack for a busy machine.
    assert time.monotonic() - started < 8
    assert running.probe.paths == []
    assert refused("head_timeout") == before + 1


async def test_a_connection_that_sends_nothing_is_closed_silently() -> None:
    async with serving(**FAST) as running:
        reader, writer = await running.connect()
        response, closed = await read_until_closed(reader)
        writer.close()
    assert closed and response == b""


async def test_the_next_head_on_a_kept_alive_connection_has_the_same_deadline() -> None:
    async with serving(**FAST) as running:
        reader, writer = await running.connect()
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = await reader.readuntil(b'{"status":"ok"}')
        writer.write(b"GET /healthz HTTP/1.1\r\n")  # the second request's head stalls
        response, closed = await read_until_closed(reader)
        writer.close()
    assert status_of(first) == 200
    assert closed and status_of(response) == 408


async def test_a_head_arriving_in_pieces_within_the_deadline_is_served() -> None:
    async with serving(request_head_timeout_seconds=2.0) as running:
        reader, writer = await running.connect()
        for piece in (
            b"GET /heal",
            b"thz HTTP/1.1\r\n",
            b"Host: x\r\n",
            b"Connection: close\r\n\r\n",
        ):
            writer.write(piece)
            await asyncio.sleep(0.2)
        response, _ = await read_until_closed(reader)
        writer.close()
    assert status_of(response) == 200


async def test_a_head_larger_than_the_limit_is_answered_431() -> None:
    async with serving(max_request_head_bytes=16_384) as running:
        reader, writer = await running.connect()
        # 64 headers of 4 KiB: far past the limit, unless something stops them.
        pieces = [b"GET /healthz HTTP/1.1\r\nHost: x\r\n"]
        pieces += [b"X-Pad: " + b"a" * 4096 + b"\r\n"] * 64
        response, closed = await send_until_answered(reader, writer, pieces, pause=0.01)
        writer.close()
    assert closed and status_of(response) == 431
    assert running.probe.paths == []


# A window long enough that a body sent at four times the rate passes even when a loaded
# machine stalls the sender for half a second.
SLOW_BODY = {"request_body_min_bytes_per_second": 100, "request_body_rate_window_seconds": 1.0}


def post_head(path: str, length: int) -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode()


async def test_a_body_trickling_below_the_minimum_rate_is_answered_408_and_closed() -> None:
    async with serving(**SLOW_BODY) as running:
        reader, writer = await running.connect()
        # 2 bytes per 0.1 s: a fifth of the minimum, for up to 10 s.
        pieces = [post_head("/echo", 1000)] + [b"a" * 2] * 100
        response, closed = await send_until_answered(reader, writer, pieces, pause=0.1)
        writer.close()
    assert closed and status_of(response) == 408
    assert b"slower than 100 bytes per second" in response
    assert running.probe.bodies == []  # the handler never got a body


async def test_a_body_at_the_minimum_rate_is_served() -> None:
    async with serving(**SLOW_BODY) as running:
        reader, writer = await running.connect()
        writer.write(post_head("/echo", 600))
        for _ in range(15):  # 40 bytes per 0.1 s: four times the minimum, over 1.5 s
            writer.write(b"a" * 40)
            await asyncio.sleep(0.1)
        response = await reader.readuntil(b"}")
        writer.close()
    assert status_of(response) == 200
    assert running.probe.bodies == [b"a" * 600]


async def test_a_body_the_app_has_not_read_yet_is_not_too_slow() -> None:
    # The whole body is sent at once; past 64 KiB the server stops reading until the
    # handler asks, 1.5 s later: more than a window with nothing received, not the client's
    # fault.
    body = b"b" * (256 << 10)
    async with serving(**SLOW_BODY) as running:
        reader, writer = await running.connect()
        writer.write(post_head("/read-later", len(body)) + body)
        response = await asyncio.wait_for(reader.readuntil(b"}"), 10)
        writer.close()
    assert status_of(response) == 200
    assert running.probe.bodies == [body]


async def test_a_client_that_stops_reading_a_response_is_dropped_after_the_write_timeout() -> None:
    async with serving(response_write_timeout_seconds=0.5) as running:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            await loop.sock_connect(sock, ("127.0.0.1", running.port))
            await loop.sock_sendall(sock, b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
            # Never read: the server's buffers fill, then it must give up on this client.
            await asyncio.wait_for(running.probe.streams_ended.wait(), 10)
            await running.open_count_reaches(0)
        finally:
            sock.close()
