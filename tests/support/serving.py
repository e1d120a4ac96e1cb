"""The harness for the serving layer's tests: the real app (routes, lifecycle, quotas, store,
ledger, metrics) over a scripted engine, served by uvicorn on loopback, with no model loaded;
and what those tests share to drive it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from safetensors.numpy import save_file
from sqlalchemy import select

from app.engine.base import Engine
from app.gateway import Gateway
from app.main import create_app
from app.metrics import render
from app.settings import Settings
from app.store.tables import UsageRow
from tests.support.scripted_engine import ScriptedEngine
from tests.support.servers import free_port, wait_until_ready

ADMIN_TOKEN = "serving-test-admin-token"
TENANT = "tenant-a"


def write_tiny_model(directory: Path) -> Path:
    """What the gateway reads of a base model (config.json, safetensors headers)."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"num_hidden_layers": 1}))
    weights = {
        f"model.layers.0.self_attn.{name}.weight": np.zeros((8, 8), dtype=np.float32)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj")
    }
    save_file(weights, str(directory / "model.safetensors"))
    return directory


@dataclass
class Served:
    """A gateway on loopback with one tenant (base model allowed) and its key."""

    base_url: str
    gateway: Gateway
    engine: ScriptedEngine
    key: str
    metrics_dir: Path

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

    async def admin(self, method: str, path: str, body: Any = None) -> Any:
        async with httpx.AsyncClient(
            base_url=f"{self.base_url}/admin/v1",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        ) as admin:
            response = await admin.request(method, path, json=body)
        assert response.status_code < 300, response.text
        return response.json() if response.content else None

    async def set_quota(self, **limits: int) -> None:
        await self.admin("PUT", f"/tenants/{TENANT}/quota", limits)

    async def usage_records(self) -> list[UsageRow]:
        await self.gateway.ledger.flush()
        async with self.gateway.sessions() as session:
            return list((await session.scalars(select(UsageRow).order_by(UsageRow.id))).all())

    async def settled(self) -> None:
        """Wait for the reconciliations handed to the background."""
        for _ in range(200):
            if not self.gateway._tasks:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("background work did not finish")

    def counter(self, name: str, **labels: str) -> float:
        body, _ = render(self.metrics_dir)
        total = 0.0
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    total += sample.value
        return total


ServeFactory = Callable[..., AbstractAsyncContextManager[Served]]


def serving(tiny_model_dir: Path, tmp_path: Path) -> ServeFactory:
    """``async with serve(engine, **settings) as served``: a gateway over ``engine``, its
    store in ``tmp_path``."""

    @asynccontextmanager
    async def running(engine: ScriptedEngine, **overrides: Any) -> AsyncIterator[Served]:
        settings = Settings(
            _env_file=None,  # type: ignore[call-arg]
            **{
                "model": str(tiny_model_dir),
                "database_url": f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}",
                "adapter_root": tmp_path / "adapters",
                "admin_token": ADMIN_TOKEN,
                "port": free_port(),
                **overrides,
            },
        )

        @asynccontextmanager
        async def scripted(_: Settings) -> AsyncIterator[Engine]:
            yield engine

        app = create_app(settings, engine_factory=scripted)
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=settings.port, log_level="warning")
        )
        task = asyncio.create_task(server.serve())
        base_url = f"http://127.0.0.1:{settings.port}"
        try:
            await asyncio.to_thread(
                wait_until_ready, f"{base_url}/readyz", alive=lambda: not task.done(), timeout=30
            )
            served = Served(base_url, app.state.gateway, engine, "", app.state.metrics_dir)
            if TENANT not in {t["id"] for t in await served.admin("GET", "/tenants")}:
                # A second gateway on the same store (a replica) finds the tenant there.
                tenant = {"id": TENANT, "name": "Tenant A", "allow_base_model": True}
                await served.admin("POST", "/tenants", tenant)
            served.key = (await served.admin("POST", f"/tenants/{TENANT}/keys", {"name": "k"}))[
                "key"
            ]
            yield served
        finally:
            server.should_exit = True
            await task

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


async def eventually(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)
