"""The shapes of request smuggling are refused with 400, the connection closed, and nothing
of them reaches the app: whatever a proxy in front makes of an ambiguous body, the gateway
does not make something else of it."""

from __future__ import annotations

import pytest

from tests.connections.probe_server import serving, status_of

SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
SHAPES = {
    "content-length then transfer-encoding": (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + SMUGGLED
    ),
    "transfer-encoding then content-length": (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Length: 40\r\n\r\n0\r\n\r\n" + SMUGGLED
    ),
    "content-length twice, one value": (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc"
        + SMUGGLED
    ),
    "content-length twice, two values": (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 40\r\n\r\nabc"
        + SMUGGLED
    ),
    "content-length as a list": (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3, 3\r\n\r\nabc" + SMUGGLED
    ),
    "an HTTP/1.0 request with both": (
        b"POST /echo HTTP/1.0\r\nHost: x\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + SMUGGLED
    ),
}


@pytest.mark.parametrize("raw", SHAPES.values(), ids=SHAPES.keys())
async def test_an_ambiguous_body_is_refused_with_400_and_the_connection_closed(raw: bytes) -> None:
    async with serving() as running:
        response, closed = await running.exchange(raw)
    assert status_of(response) == 400
    assert closed
    assert response.count(b"HTTP/1.1") == 1
    assert running.probe.paths == []


async def test_one_content_length_is_served() -> None:
    raw = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc"
    async with serving() as running:
        response, _ = await running.exchange(raw)
    assert status_of(response) == 200
    assert running.probe.bodies == [b"abc"]
