"""The front's HTTP/1.1 client against a raw socket server on loopback, each test scripting
what the server writes: keep-alive reuse, a stale connection retried once, every failure as
its transport error, server-sent events however the bytes are split."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from app.serving.front.http1 import ConnectFailed, ConnectionLost, Http1Client, ReadTimedOut
from app.serving.front.upstream import open_upstream
from app.settings import Settings
from tests.support.servers import free_port

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


def answer(body: bytes, status: int = 200, extra: str = "") -> bytes:
    head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


def chunked(*pieces: bytes) -> list[bytes]:
    """A chunked answer's writes: the head, each piece as a chunk, the last chunk."""
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    return [head, *(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces), b"0\r\n\r\n"]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's head and body (the client always sends a Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head + await reader.readexactly(length)


@asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[tuple[str, list[bytes]]]:
    """A server calling ``handler`` with each connection and its number; yields its URL and
    the requests it read (appended by the handlers)."""
    connections = 0
    handlers: set[asyncio.Task[None]] = set()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        handler_task = asyncio.current_task()
        assert handler_task is not None
        handlers.add(handler_task)
        handler_task.add_done_callback(handlers.discard)
        try:
            await handler(reader, writer, connections)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    port = free_port()
    listening = await asyncio.start_server(accept, "127.0.0.1", port)
    try:
        yield f"http://127.0.0.1:{port}/prefix/", []
    finally:
        # A handler waiting on a connection the client kept open would outlive the test (the
        # event loop is the session's) and be counted by another's check for leftover tasks.
        listening.close()
        for task in list(handlers):
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await listening.wait_closed()


def client(url: str, timeout: float = 5.0) -> Http1Client:
    return Http1Client(url, timeout=timeout, connect_timeout=2.0)


async def test_a_connection_read_to_its_end_serves_the_next_request() -> None:
    seen: list[tuple[int, bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            seen.append((n, await read_request(reader)))
            writer.write(answer(b'{"ok":true}'))

    async with server(handler) as (url, _):
        upstream = client(url)
        for _ in range(3):
            response = await upstream.post("/v1/x", b'{"a":1}', {"x-request-id": "r1"})
            assert (response.status, await response.read()) == (200, b'{"ok":true}')
        await upstream.aclose()
    assert [n for n, _ in seen] == [1, 1, 1]
    request = seen[0][1]
    assert request.startswith(b"POST /prefix/v1/x HTTP/1.1\r\n")
    assert b"\r\nx-request-id: r1\r\n" in request and request.endswith(b'\r\n\r\n{"a":1}')


@pytest.mark.parametrize("kept", [1, 3])
async def test_connections_are_kept_for_the_next_requests_up_to_the_setting(kept: int) -> None:
    """Four requests at once, then four more: the second wave reuses as many connections as
    the deployment keeps idle, and opens the rest anew."""
    used: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await read_request(reader)
            used.append(n)
            writer.write(answer(b"{}"))

    async def request(upstream: Http1Client) -> None:
        response = await upstream.post("/v1/x", b"{}", {})
        assert await response.read() == b"{}"

    async with server(handler) as (url, _):
        settings = Settings(role="front", upstream_url=url, upstream_idle_connections=kept)
        async with open_upstream(settings) as upstream:
            await asyncio.gather(*(request(upstream.client) for _ in range(4)))
            first = set(used)
            await asyncio.gather(*(request(upstream.client) for _ in range(4)))
    second = set(used[4:])
    assert first == {1, 2, 3, 4}
    assert len(second & first) == kept and len(second - first) == 4 - kept


async def test_a_kept_connection_the_upstream_dropped_is_retried_once_on_a_new_one() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(answer(b"first" if n == 1 else b"again"))
        if n == 1:
            await read_request(reader)  # the second request: dropped unanswered

    async with server(handler) as (url, _):
        upstream = client(url)
        assert await (await upstream.post("/", b"{}", {})).read() == b"first"
        assert await (await upstream.post("/", b"{}", {})).read() == b"again"
        await upstream.aclose()


async def test_a_new_connection_closed_before_an_answer_is_lost_not_retried() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)

    async with server(handler) as (url, _):
        with pytest.raises(ConnectionLost, match="closed the connection"):
            await client(url).post("/", b"{}", {})


async def test_failures_are_transport_errors() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        await asyncio.sleep(10)

    async def not_http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(10)

    async with server(silent) as (url, _):
        with pytest.raises(ReadTimedOut):
            await client(url, timeout=0.2).post("/", b"{}", {})
    async with server(not_http) as (url, _):
        with pytest.raises(ConnectionLost, match="not HTTP"):
            await client(url).post("/", b"{}", {})
    with pytest.raises(ConnectFailed):
        await client(f"http://127.0.0.1:{free_port()}").post("/", b"{}", {})
    with pytest.raises(ValueError, match="line break"):
        await client("http://127.0.0.1:1").post("/", b"{}", {"x-a": "b\r\nHost: evil"})


async def test_events_are_each_data_field_however_the_bytes_are_split() -> None:
    body = b'data: {"n":1}\n\ndata: {"n":2}\r\n\r\n: a comment\n\nevent: x\ndata: [DONE]\n\n'
    pieces = [body[:3], body[3:17], body[17:30], body[30:]]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        for write in chunked(*pieces):
            writer.write(write)
            await writer.drain()
            await asyncio.sleep(0.01)  # each piece a read of its own
        await read_request(reader)
        writer.write(answer(b"kept"))

    async with server(handler) as (url, _):
        upstream = client(url)
        response = await upstream.post("/", b"{}", {})
        events = [data async for data in response.events()]
        assert events == [b'{"n":1}', b'{"n":2}', b"[DONE]"]
        assert await (await upstream.post("/", b"{}", {})).read() == b"kept"
        await upstream.aclose()


async def test_a_stream_closed_before_its_end_closes_the_connection() -> None:
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        head, *rest = chunked(b"data: 1\n\n", b"data: 2\n\n")
        writer.write(head + rest[0])
        await reader.read()  # until the client hangs up
        closed.set()

    async with server(handler) as (url, _):
        response = await client(url).post("/", b"{}", {})
        events = response.events()
        assert await anext(events) == b"1"
        await events.aclose()
        await response.aclose()
        await asyncio.wait_for(closed.wait(), 60)  # bounds a hang only


async def test_the_end_of_a_stream_after_its_last_event_keeps_the_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        head, event, end = chunked(b"data: [DONE]\n\n")
        writer.write(head + event)
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(end)  # the body's end comes after the last event
        await read_request(reader)
        writer.write(answer(b"same connection" if n == 1 else b"new connection"))

    async with server(handler) as (url, _):
        upstream = client(url)
        response = await upstream.post("/", b"{}", {})
        events = response.events()
        assert await anext(events) == b"[DONE]"
        await events.aclose()
        await response.finish(within=1.0)
        assert await (await upstream.post("/", b"{}", {})).read() == b"same connection"
        await upstream.aclose()


async def test_the_timeout_is_a_wait_for_the_next_byte_not_for_the_whole_answer() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        head, *events, end = chunked(*(b"data: %d\n\n" % i for i in range(6)))
        writer.write(head)
        for write in [*events, end] if n == 1 else events[:2]:
            await asyncio.sleep(0.2)
            writer.write(write)
        await asyncio.sleep(10)

    async with server(handler) as (url, _):
        upstream = client(url, timeout=1.0)
        slow_but_steady = await upstream.post("/", b"{}", {})  # 1.4 s in all
        assert [data async for data in slow_but_steady.events()] == [b"%d" % i for i in range(6)]
        stalled = await client(url, timeout=1.0).post("/", b"{}", {})
        events = stalled.events()
        assert [await anext(events), await anext(events)] == [b"0", b"1"]
        with pytest.raises(ReadTimedOut, match=r"in 1 s"):
            await anext(events)
