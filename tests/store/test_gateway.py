"""The gateway's own background work, stopped before the stores it uses close."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import gateway as gateway_module
from app.gateway import Gateway
from app.settings import Settings
from app.tenancy.validation import BaseModelInfo
from app.usage import usage_totals
from tests.store.test_usage import DAY, record


async def test_shutdown_leaves_nothing_running_and_nothing_unwritten(
    sessions: async_sessionmaker[AsyncSession],
    base_model: BaseModelInfo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gateway_module, "BACKGROUND_GRACE_SECONDS", 0.5)
    settings = Settings(_env_file=None, adapter_root=tmp_path, registry_poll_seconds=0.01)
    gateway = Gateway(settings, sessions, base_model)
    finished = []

    async def short_work() -> None:
        await asyncio.sleep(0.1)
        finished.append("short")

    async def endless_work() -> None:
        await asyncio.Event().wait()

    async with gateway.running():
        await asyncio.sleep(0.05)  # the store watcher is polling
        gateway.background(short_work())
        gateway.background(endless_work())
        gateway.ledger.record(record(1, model="base", key="k", day=DAY, prompt=3, completion=2))

    assert finished == ["short"]  # waited for, within the grace period
    assert asyncio.all_tasks() == {asyncio.current_task()}  # the rest cancelled, and done
    (total,) = await usage_totals(sessions, "acme", start=None, end=None, group_by=None)
    assert total.requests == 1  # the last record written
