"""Streamed events go straight to the server's ``send`` only where every middleware passes
bodies through: a middleware that rewrites bodies is never bypassed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.completion_response import EventStreamResponse
from app.api.streaming_app import SERVER_SEND, StreamingApp
from app.main import create_app
from tests.support.harness import app_settings


class Watching:
    """Records the messages it sees; passes them on unchanged."""

    passes_bodies_through: ClassVar[bool] = True
    seen: ClassVar[list[str]] = []

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def watched(message: Message) -> None:
            self.seen.append(message["type"])
            await send(message)

        await self.app(scope, receive, watched)


class Shouting:
    """Rewrites every body (upper case); says nothing about passing bodies through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def shout(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": message["body"].upper()}
            await send(message)

        await self.app(scope, receive, shout)


def stream_app(*middleware: type) -> StreamingApp:
    app = StreamingApp()

    async def events() -> AsyncIterator[str]:
        for text in ("one", "two"):
            yield f"data: {text}\n\n"

    @app.get("/stream")
    async def stream() -> EventStreamResponse:
        return EventStreamResponse(events())

    for cls in middleware:
        app.add_middleware(cls)
    return app


async def call(app: StreamingApp) -> list[Message]:
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/stream",
        "raw_path": b"/stream",
        "query_string": b"",
        "root_path": "",
        "headers": [],
        "server": ("test", 80),
        "client": ("test", 1),
    }
    sent: list[Message] = []
    requested = False

    async def receive() -> Message:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()
        raise AssertionError("never reached")

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


@pytest.fixture(autouse=True)
def _clear_seen() -> None:
    Watching.seen.clear()


async def test_events_skip_middleware_that_passes_bodies_through() -> None:
    sent = await call(stream_app(Watching))
    bodies = [m["body"] for m in sent if m["type"] == "http.response.body"]
    assert b"".join(bodies) == b"data: one\n\ndata: two\n\n"
    assert Watching.seen == ["http.response.start"]


async def test_a_middleware_that_may_rewrite_bodies_sees_every_event() -> None:
    sent = await call(stream_app(Watching, Shouting))
    bodies = [m["body"] for m in sent if m["type"] == "http.response.body"]
    assert b"".join(bodies) == b"DATA: ONE\n\nDATA: TWO\n\n"
    assert Watching.seen.count("http.response.body") == 3


async def test_the_gateway_keeps_the_servers_send_for_its_streams(tmp_path: Path) -> None:
    app = create_app(app_settings(tmp_path))
    scopes: list[Scope] = []

    async def routes(scope: Scope, receive: Receive, send: Send) -> None:
        scopes.append(scope)

    app.middleware_stack = routes  # the app's own middleware is what decides
    await app({"type": "http"}, None, None)  # type: ignore[arg-type]
    assert SERVER_SEND in scopes[0]


async def served_raw(app: StreamingApp, request: bytes) -> bytes:
    """``request``'s answer, as uvicorn's httptools server writes it on loopback."""
    import uvicorn

    config = uvicorn.Config(app, host="127.0.0.1", port=0, http="httptools", log_level="error")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    answer = await asyncio.wait_for(reader.read(), 60)  # the connection closes after it
    writer.close()
    server.should_exit = True
    await serving
    return answer


async def test_events_written_straight_to_uvicorns_connection_are_framed_as_uvicorn_does() -> None:
    writers: list[str] = []

    class NamingTheWriter:
        passes_bodies_through: ClassVar[bool] = True

        def __init__(self, app: ASGIApp) -> None:
            self.app = app

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            from app.api.streaming_app import body_writer

            async def named(message: Message) -> None:
                await send(message)
                if message["type"] == "http.response.start":
                    writers.append(body_writer(scope[SERVER_SEND]).__name__)

            await self.app(scope, receive, named)

    request = b"GET /stream HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    answer = await served_raw(stream_app(NamingTheWriter), request)
    assert writers == ["direct"], "the events did not go straight to the connection"
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower()
    assert body == b"b\r\ndata: one\n\n\r\nb\r\ndata: two\n\n\r\n0\r\n\r\n"
    # Through a middleware that rewrites bodies, the same stream goes through uvicorn's send.
    answer = await served_raw(stream_app(Shouting), request)
    assert (
        answer.partition(b"\r\n\r\n")[2] == b"b\r\nDATA: ONE\n\n\r\nb\r\nDATA: TWO\n\n\r\n0\r\n\r\n"
    )
