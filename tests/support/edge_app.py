"""The whole app, lifespan and store included but no engine, driven by hand over ASGI
so a test sees exactly how much of a request body the app read (the harness's settings,
tests/support/harness.py, without a server)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from starlette.types import Message

from app.admin import schemas
from app.engine.base import Engine
from app.gateway import Gateway
from app.main import create_app
from app.settings import Settings

TENANT = "edge-tenant"
CHUNK = 1 << 20


@asynccontextmanager
async def no_engine(settings: Settings) -> AsyncIterator[Engine]:
    # These tests stop at the edge: nothing reaches the engine.
    raise RuntimeError("no engine in the edge tests")
    yield  # pragma: no cover


@dataclass
class EdgeApp:
    app: FastAPI
    tenant_key: str

    @property
    def gateway(self) -> Gateway:
        gateway: Gateway = self.app.state.gateway
        return gateway


@asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[EdgeApp]:
    """``create_app(settings)`` with its lifespan entered, and one tenant with a key."""
    app = create_app(settings, engine_factory=no_engine)
    async with app.router.lifespan_context(app):
        gateway: Gateway = app.state.gateway
        admin = gateway.admin
        await admin.create_tenant("test", schemas.TenantCreate(id=TENANT, name="Edge"))
        _, key = await admin.create_key("test", TENANT, schemas.KeyCreate(name="edge"))
        yield EdgeApp(app, key)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    delivered: int  # request body bytes the app took through ``receive``
    messages: list[Message] = field(default_factory=list)

    def json(self) -> Any:
        import json

        return json.loads(self.body)


def body_of(size: int) -> Iterator[bytes]:
    """``size`` bytes in 1 MiB chunks, made only as they are asked for."""
    while size > 0:
        chunk = min(size, CHUNK)
        yield b"x" * chunk
        size -= chunk


async def call(
    app: FastAPI,
    method: str,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    body: Iterator[bytes] | bytes = b"",
    client: tuple[str, int] = ("203.0.113.7", 50000),
) -> Answer:
    """One request, its body delivered chunk by chunk as the app asks for it."""
    chunks = iter([body]) if isinstance(body, bytes) else body
    pending = next(chunks, None)
    delivered = 0
    sent: list[Message] = []

    async def receive() -> Message:
        nonlocal pending, delivered
        if pending is None:
            return {"type": "http.disconnect"}
        chunk, pending = pending, next(chunks, None)
        delivered += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": pending is not None}

    async def send(message: Message) -> None:
        sent.append(message)

    path, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": query.encode(),
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        "client": client,
        "server": ("127.0.0.1", 8000),
    }
    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    return Answer(
        status=start["status"],
        headers={k.decode(): v.decode() for k, v in start["headers"]},
        body=b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"),
        delivered=delivered,
        messages=sent,
    )
