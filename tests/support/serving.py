"""The serving layer's tests: the real app (routes, lifecycle, quotas, store, ledger, metrics)
over a scripted engine, served on loopback by the harness (tests/support/harness.py) with no
model loaded; and what those tests share to drive it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx

from tests.support.harness import (
    RunningApp,
    ServerFactory,
    app_settings,
    scripted,
    serve,
    uvicorn_server,
)
from tests.support.scripted_engine import ScriptedEngine

TENANT = "tenant-a"


@dataclass
class Served(RunningApp):
    """A gateway on loopback over a scripted engine, with one tenant (base model allowed) and
    its key."""

    engine: ScriptedEngine = field(default_factory=ScriptedEngine)
    key: str = ""

    @property
    def model(self) -> str:
        return self.gateway.registry.base_model_id

    def client(self, **kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=30,
            **kwargs,
        )

    async def set_quota(self, **limits: int) -> None:
        await self.admin("PUT", f"/tenants/{TENANT}/quota", limits)


ServeFactory = Callable[..., AbstractAsyncContextManager[Served]]


def serving(tiny_model_dir: Path, tmp_path: Path) -> ServeFactory:
    """``async with serve(engine, **settings) as served``: a gateway over ``engine``, its
    store in ``tmp_path``; ``server_factory`` serves it otherwise than plain uvicorn."""

    @asynccontextmanager
    async def running(
        engine: ScriptedEngine, server_factory: ServerFactory = uvicorn_server, **overrides: Any
    ) -> AsyncIterator[Served]:
        settings = app_settings(tmp_path, model=str(tiny_model_dir), **overrides)
        async with serve(
            settings, scripted(engine), timeout=30, server_factory=server_factory
        ) as running:
            served = Served(running.base_url, running.app, engine)
            if TENANT not in {t["id"] for t in await served.admin("GET", "/tenants")}:
                # A second gateway on the same store (a replica) finds the tenant there.
                tenant = {"id": TENANT, "name": "Tenant A", "allow_base_model": True}
                await served.admin("POST", "/tenants", tenant)
            served.key = (await served.admin("POST", f"/tenants/{TENANT}/keys", {"name": "k"}))[
                "key"
            ]
            yield served

    return running


def sse_events(body: str) -> list[Any]:
    """The ``data:`` payloads of an SSE body, JSON-decoded, ``[DONE]`` kept as a string."""
    events = []
    for line in body.splitlines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def chat(served: Served, **fields: Any) -> dict[str, Any]:
    return {"model": served.model, "messages": [{"role": "user", "content": "hi"}], **fields}


async def quota_usage(served: Served) -> SimpleNamespace:
    """The tenant's quota usage, as an admin reads it."""
    usage = await served.admin("GET", f"/tenants/{TENANT}/quota/usage")
    return SimpleNamespace(concurrent=usage["concurrent_requests"], **usage)


async def eventually(predicate: Any, timeout: float = 60.0) -> None:
    """Wait until ``predicate`` holds; ``timeout`` bounds only a hang."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)
