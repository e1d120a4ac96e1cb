"""The completion endpoints' lane past the router (app/api/generation_lane.py)."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.types import Message, Receive, Scope, Send

from app.api import openai
from app.api.errors import install_error_handlers
from app.api.generation_lane import GenerationLane
from app.api.generation_route import GenerationRoute
from app.api.routes import include_routers
from app.errors import BadRequestError


class Exchange:
    """One request through the lane, its inner app a recorder of what reached it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, serve: object) -> None:
        self.app = FastAPI()
        include_routers(self.app, openai.router)
        install_error_handlers(self.app)
        for route in self.app.router.routes:
            if isinstance(route, GenerationRoute):  # shared by every app: patched for this test
                monkeypatch.setattr(route, "serve", serve)
        self.passed_on: list[str] = []
        self.sent: list[Message] = []

    async def inner(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.passed_on.append(f"{scope['method']} {scope['path']}")

    async def __call__(self, method: str, path: str) -> None:
        scope = {"type": "http", "method": method, "path": path, "app": self.app, "headers": []}
        scope["state"] = {}

        async def receive() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Message) -> None:
            self.sent.append(message)

        await GenerationLane(self.inner)(scope, receive, send)

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])


async def answered(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def test_a_completion_request_goes_to_its_route_and_anything_else_to_the_router(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exchange = Exchange(monkeypatch, answered)
    await exchange("POST", "/v1/chat/completions")
    await exchange("POST", "/v1/completions")
    assert [m["type"] for m in exchange.sent] == ["http.response.start", "http.response.body"] * 2
    assert exchange.passed_on == []
    await exchange("GET", "/v1/chat/completions")  # the router's 405
    await exchange("POST", "/v1/models")
    assert exchange.passed_on == ["GET /v1/chat/completions", "POST /v1/models"]


async def test_a_refusal_is_answered_by_the_apps_handler_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def refusing(scope: Scope, receive: Receive, send: Send) -> None:
        raise BadRequestError("`n` must be 1.", param="n")

    exchange = Exchange(monkeypatch, refusing)
    await exchange("POST", "/v1/chat/completions")
    assert exchange.status == 400
    assert json.loads(exchange.sent[1]["body"])["error"]["param"] == "n"

    async def not_found(scope: Scope, receive: Receive, send: Send) -> None:
        raise HTTPException(404)

    exchange = Exchange(monkeypatch, not_found)
    await exchange("POST", "/v1/completions")
    assert exchange.status == 404


async def test_what_no_handler_takes_or_comes_after_the_start_goes_on_to_the_server_error_handler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def failing(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        await Exchange(monkeypatch, failing)("POST", "/v1/chat/completions")

    async def refusing_late(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise BadRequestError("too late to say so")

    exchange = Exchange(monkeypatch, refusing_late)
    with pytest.raises(BadRequestError):
        await exchange("POST", "/v1/chat/completions")
    assert [m["type"] for m in exchange.sent] == ["http.response.start"]
