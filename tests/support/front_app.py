"""Front-role gateways for tests: ``create_app`` with ``role=front`` served by uvicorn on
loopback, in front of any upstream, with no engine; the embedded model's directory gives the
tokenizer. Several may share one store and one quota store (replicas)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from app.errors import EngineUnavailableError
from app.gateway import Gateway
from app.main import create_app
from app.metrics import render
from app.settings import EMBEDDED_MODEL_DIR, Settings
from app.store.tables import UsageRow
from tests.support.servers import free_port, wait_until_ready

ADMIN_TOKEN = "front-test-admin-token"


@dataclass
class Front:
    base_url: str
    gateway: Gateway
    metrics_dir: Path

    def samples(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` with ``labels`` in the front's /metrics."""
        body, _ = render(self.metrics_dir)
        return sum(
            sample.value
            for family in text_string_to_metric_families(body.decode())
            for sample in family.samples
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
        )

    async def admin(self, method: str, path: str, body: Any = None) -> Any:
        async with httpx.AsyncClient(
            base_url=f"{self.base_url}/admin/v1",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=60,
        ) as admin:
            response = await admin.request(method, path, json=body)
        assert response.status_code < 300, response.text
        return response.json() if response.content else None

    def client(self, key: str, **kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30, **kwargs
        )

    async def usage_records(self) -> list[UsageRow]:
        await self.gateway.ledger.flush()
        async with self.gateway.sessions() as session:
            return list((await session.scalars(select(UsageRow).order_by(UsageRow.id))).all())

    async def records_after(self, known: int, timeout: float = 10.0) -> list[UsageRow]:
        """The usage records, once there are more than ``known`` and the reconciliations are
        done: a request the client left is recorded when the front notices, not before."""
        for _ in range(int(timeout / 0.02)):
            records = await self.usage_records()
            if len(records) > known:
                await self.settled()
                return records
            await asyncio.sleep(0.02)
        raise AssertionError("no usage record came")

    async def settled(self) -> None:
        """Wait for the reconciliations handed to the background."""
        for _ in range(500):
            if not self.gateway._tasks:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("background work did not finish")


def admin_call(front_url: str, method: str, path: str, body: Any = None) -> Any:
    """One admin API call to a front (from synchronous code), which must succeed."""
    response = httpx.request(
        method,
        f"{front_url}/admin/v1{path}",
        json=body,
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=120,
    )
    assert response.status_code < 300, response.text
    return response.json() if response.content else None


def front_settings(upstream_url: str, state: Path, **overrides: Any) -> Settings:
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        **{
            "role": "front",
            "upstream_url": upstream_url,
            "model": str(EMBEDDED_MODEL_DIR.resolve()),
            "max_model_len": 512,
            "database_url": f"sqlite+aiosqlite:///{state / 'gateway.db'}",
            "adapter_root": state / "adapters",
            "admin_token": ADMIN_TOKEN,
            "port": free_port(),
            **overrides,
        },
    )


@asynccontextmanager
async def running_front(settings: Settings, *, ready: bool = True) -> AsyncIterator[Front]:
    """Serve a front app until the block ends; wait for ``/readyz`` (or, when the upstream is
    meant to be down, for ``/healthz``)."""
    app = create_app(settings)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=settings.port, log_level="warning")
    )
    task = asyncio.create_task(server.serve())
    base_url = f"http://127.0.0.1:{settings.port}"
    try:
        probe = "/readyz" if ready else "/healthz"
        await asyncio.to_thread(
            wait_until_ready, f"{base_url}{probe}", alive=lambda: not task.done(), timeout=60
        )
        gateway: Gateway = app.state.gateway
        for _ in range(6000):
            with contextlib.suppress(EngineUnavailableError):
                gateway.backend  # noqa: B018 (loaded: the tokenizer and the upstream client)
                break
            await asyncio.sleep(0.01)
        yield Front(base_url, gateway, app.state.metrics_dir)
    finally:
        server.should_exit = True
        await task
