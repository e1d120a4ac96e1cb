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
