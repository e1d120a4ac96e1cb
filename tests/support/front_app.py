"""Front-role gateways for tests: the harness (tests/support/harness.py) serving ``create_app``
with ``role=front`` in front of any upstream, with no engine; the embedded model's directory
gives the tokenizer. Several may share one store and one quota store (replicas)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from app.errors import EngineUnavailableError
from app.settings import EMBEDDED_MODEL_DIR, Settings
from app.store.tables import UsageRow
from tests.support.harness import ADMIN_TOKEN, RunningApp, app_settings, serve


class Front(RunningApp):
    def client(self, key: str, **kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30, **kwargs
        )

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
    front = {"role": "front", "upstream_url": upstream_url, "max_model_len": 512}
    return app_settings(state, **{**front, "model": str(EMBEDDED_MODEL_DIR.resolve()), **overrides})


@asynccontextmanager
async def running_front(settings: Settings, *, ready: bool = True) -> AsyncIterator[Front]:
    """Serve a front app until the block ends; wait for ``/readyz`` (or, when the upstream is
    meant to be down, for ``/healthz``)."""
    async with serve(settings, ready="/readyz" if ready else "/healthz") as running:
        front = Front(running.base_url, running.app)
        for _ in range(6000):
            with contextlib.suppress(EngineUnavailableError):
                front.gateway.backend  # noqa: B018 (loaded: the tokenizer and the upstream client)
                break
            await asyncio.sleep(0.01)
        yield front
