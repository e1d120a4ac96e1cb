"""The gateway's own background work, stopped before the stores it uses close."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import gateway as gateway_module
from app.admin.mutations import bump_revision
from app.gateway import Gateway
from app.serving.backend import backend_factory
from app.serving.in_process.backend import start_vllm_engine
from app.settings import Settings
from app.store.changes import StoreVersion
from app.tenancy.base_model import BaseModelInfo
from app.usage import UsageRecord, usage_totals
from app.usage import ledger as usage_module
from tests.support.store_polls import store_polls
from tests.support.usage import ACME_UID, DAY, record


def polling_gateway(
    sessions: async_sessionmaker[AsyncSession], base_model: BaseModelInfo, tmp_path: Path
) -> Gateway:
    """A gateway whose store watcher polls every 10 ms."""
    settings = Settings(_env_file=None, adapter_root=tmp_path, registry_poll_seconds=0.01)
    return Gateway(settings, sessions, base_model, backend_factory(settings, start_vllm_engine))


async def test_shutdown_leaves_nothing_running_and_nothing_unwritten(
    sessions: async_sessionmaker[AsyncSession],
    base_model: BaseModelInfo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gateway_module, "BACKGROUND_GRACE_SECONDS", 0.5)
    gateway = polling_gateway(sessions, base_model, tmp_path)
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
    (total,) = await usage_totals(sessions, ACME_UID, start=None, end=None, group_by=None)
    assert total.requests == 1  # the last record written


async def test_a_write_under_way_at_shutdown_keeps_its_batch(
    sessions: async_sessionmaker[AsyncSession],
    base_model: BaseModelInfo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(usage_module, "FLUSH_SECONDS", 0.05)
    settings = Settings(_env_file=None, adapter_root=tmp_path)
    gateway = Gateway(settings, sessions, base_model, backend_factory(settings, start_vllm_engine))
    writing, release = asyncio.Event(), asyncio.Event()
    insert = gateway.ledger._insert

    async def slow_insert(records: Iterable[UsageRecord]) -> None:
        writing.set()  # a slow store: the write is under way when shutdown begins
        await release.wait()
        await insert(records)

    monkeypatch.setattr(gateway.ledger, "_insert", slow_insert)
    for n in range(10):
        gateway.ledger.record(record(n, model="base", key="k", day=DAY, prompt=3, completion=2))
    async with gateway.running():
        await writing.wait()
        asyncio.get_running_loop().call_later(0.2, release.set)

    (total,) = await usage_totals(sessions, ACME_UID, start=None, end=None, group_by=None)
    assert (total.requests, gateway.ledger.pending) == (10, 0)


async def test_a_store_stuck_at_shutdown_cannot_hold_it_and_loses_nothing(
    sessions: async_sessionmaker[AsyncSession],
    base_model: BaseModelInfo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(usage_module, "FLUSH_SECONDS", 0.05)
    monkeypatch.setattr(usage_module, "CLOSE_TIMEOUT_SECONDS", 0.3)
    settings = Settings(_env_file=None, adapter_root=tmp_path)
    gateway = Gateway(settings, sessions, base_model, backend_factory(settings, start_vllm_engine))
    writing = asyncio.Event()

    async def stuck_insert(records: Iterable[UsageRecord]) -> None:
        writing.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(gateway.ledger, "_insert", stuck_insert)
    for n in range(10):
        gateway.ledger.record(record(n, model="base", key="k", day=DAY, prompt=3, completion=2))
    with caplog.at_level(logging.ERROR, logger="app.usage"):
        async with gateway.running():
            await writing.wait()
    logged = [r.getMessage() for r in caplog.records]
    ids = [m.split('"request_id": "')[1].split('"')[0] for m in logged if "unwritten" in m]
    assert ids == [f"r{n}" for n in range(10)]  # every one, in the log, for replay
    assert gateway.ledger.pending == 0
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_a_store_that_fails_a_poll_is_logged_and_polled_again(
    sessions: async_sessionmaker[AsyncSession],
    base_model: BaseModelInfo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gateway = polling_gateway(sessions, base_model, tmp_path)
    polls = []
    real_revision = gateway_module.revision

    async def flaky_revision(
        store: async_sessionmaker[AsyncSession], version: StoreVersion | None = None
    ) -> int:
        polls.append(len(polls))
        if len(polls) == 1:
            raise ConnectionError("the store went away")
        return await real_revision(store, version)

    monkeypatch.setattr(gateway_module, "revision", flaky_revision)
    stop = asyncio.Event()
    with caplog.at_level(logging.ERROR, logger=gateway_module.__name__):
        watching = asyncio.create_task(gateway.watch_store(stop))
        async with asyncio.timeout(60):  # bounds a hang only: two polls of 10 ms
            while len(polls) < 2:
                await asyncio.sleep(0.01)
        stop.set()
        await watching
    assert len(polls) >= 2  # the poll after the failure read the store again
    # The gateway's own records: caplog takes every logger's, a gateway served on a thread
    # of this worker included (the fuzz suite's).
    ours = [r.getMessage() for r in caplog.records if r.name == gateway_module.__name__]
    assert ours == ["could not refresh from the store"]


async def test_the_revision_is_read_again_only_after_a_commit_where_the_store_counts_them(
    sessions: async_sessionmaker[AsyncSession],
    base_model: BaseModelInfo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gateway = polling_gateway(sessions, base_model, tmp_path)
    reads = []
    real_revision = gateway_module.revision

    async def counted_revision(
        store: async_sessionmaker[AsyncSession], version: StoreVersion | None = None
    ) -> int:
        reads.append(1)
        return await real_revision(store, version)

    monkeypatch.setattr(gateway_module, "revision", counted_revision)
    counts_commits = gateway.store_version.current() is not None
    assert counts_commits == (sessions.kw["bind"].dialect.name == "sqlite")
    stop = asyncio.Event()
    with store_polls(gateway) as polls:
        watching = asyncio.create_task(gateway.watch_store(stop))
        await polls.run_async(5)
        idle_reads = len(reads)
        async with sessions.begin() as session:  # as another replica's change
            await bump_revision(session)
        changed_revision = await real_revision(sessions)
        polls.expect(lambda: gateway._revision == changed_revision)
        assert await polls.seen_async() <= 2
        await polls.run_async(5)
        stop.set()
        await watching
    if counts_commits:
        assert idle_reads == 1  # the first poll's: then no commit, no read
        assert len(reads) == 2  # the commit's
    else:
        assert idle_reads >= 5 and len(reads) >= 10  # every poll reads


async def test_a_gateway_records_its_keys_use_every_so_often_and_at_shutdown(
    sessions: async_sessionmaker[AsyncSession],
    base_model: BaseModelInfo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gateway = polling_gateway(sessions, base_model, tmp_path)
    written: list[set[str]] = []

    async def touch_keys(key_ids: Iterable[str], at: object) -> None:
        if ids := set(key_ids):
            written.append(ids)

    monkeypatch.setattr(gateway.admin, "touch_keys", touch_keys)
    gateway._used_keys.add("key_a")
    stop = asyncio.Event()
    watching = asyncio.create_task(gateway.watch_store(stop))
    await asyncio.sleep(0.1)  # polls of 10 ms: none is due yet
    assert written == []
    monkeypatch.setattr(gateway_module, "KEY_USE_SECONDS", 0.0)
    async with asyncio.timeout(60):  # bounds a hang only
        while not written:
            await asyncio.sleep(0.01)
    assert written == [{"key_a"}]
    monkeypatch.setattr(gateway_module, "KEY_USE_SECONDS", 3600.0)
    gateway._used_keys.add("key_b")
    stop.set()
    await watching
    assert written == [{"key_a"}, {"key_b"}]  # the last use, recorded at shutdown
