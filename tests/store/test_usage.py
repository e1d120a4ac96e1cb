"""The usage ledger on every store backend."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from app import metrics
from app.store.db import store_is_down
from app.usage import UsageLedger, UsageRecord, UsageTotal, usage_totals
from tests.support.servers import free_port, postgres_starting_up
from tests.support.usage import ACME_UID, DAY, record


async def test_records_are_written_in_batches_and_totalled(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    ledger = UsageLedger(sessions)
    ledger.record(record(1, model="legal", key="k1", day=DAY, prompt=10, completion=5))
    ledger.record(record(2, model="legal", key="k2", day=DAY, prompt=20, completion=7))
    ledger.record(
        record(3, model="base", key="k1", day=DAY + timedelta(days=1), prompt=1, completion=1)
    )
    assert await usage_totals(sessions, ACME_UID, start=None, end=None, group_by=None) == [
        UsageTotal(None, 0, 0, 0)
    ]
    assert await ledger.flush() == 3
    assert await ledger.flush() == 0

    (total,) = await usage_totals(sessions, ACME_UID, start=None, end=None, group_by=None)
    assert (total.requests, total.prompt_tokens, total.completion_tokens) == (3, 31, 13)
    by_adapter = await usage_totals(sessions, ACME_UID, start=None, end=None, group_by="adapter")
    assert [(t.group, t.requests, t.prompt_tokens) for t in by_adapter] == [
        ("base", 1, 1),
        ("legal", 2, 30),
    ]
    by_key = await usage_totals(sessions, ACME_UID, start=None, end=None, group_by="key")
    assert [(t.group, t.requests) for t in by_key] == [("k1", 2), ("k2", 1)]
    by_day = await usage_totals(sessions, ACME_UID, start=None, end=None, group_by="day")
    assert [(t.group, t.requests) for t in by_day] == [("2026-11-01", 2), ("2026-11-02", 1)]
    window = await usage_totals(
        sessions, ACME_UID, start=DAY + timedelta(hours=1), end=None, group_by=None
    )
    assert window[0].requests == 1
    assert (await usage_totals(sessions, "other", start=None, end=None, group_by=None))[
        0
    ].requests == 0


# The ledgers here count in metrics of their own: the process's are shared with any gateway
# another test of this worker runs, and move to a new storage whenever one starts or stops.
USAGE = CollectorRegistry()
USAGE_RECORDS = Counter("usage_records", "", ["outcome"], registry=USAGE)
USAGE_PENDING = Gauge("usage_records_pending", "", ["state"], registry=USAGE)


@pytest.fixture(autouse=True)
def usage_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "USAGE_RECORDS", USAGE_RECORDS)
    monkeypatch.setattr(metrics, "USAGE_PENDING", USAGE_PENDING)


def counted(outcome: str) -> float:
    return USAGE.get_sample_value("usage_records_total", {"outcome": outcome}) or 0.0


def pending_gauge() -> float:
    return sum(
        USAGE.get_sample_value("usage_records_pending", {"state": state}) or 0.0
        for state in ("queued", "writing")
    )


async def total_requests(sessions: async_sessionmaker[AsyncSession]) -> int:
    (total,) = await usage_totals(sessions, ACME_UID, start=None, end=None, group_by=None)
    return total.requests


async def test_a_record_the_store_refuses_is_set_aside_and_blocks_nothing(
    sessions: async_sessionmaker[AsyncSession], caplog: pytest.LogCaptureFixture
) -> None:
    ledger = UsageLedger(sessions)
    poison = replace(record(2, model="base", key="k", day=DAY, prompt=1, completion=1))
    object.__setattr__(poison, "tenant_id", None)  # NOT NULL: refused whatever the batch
    rejected = counted("rejected")
    for n in (1, 2, 3):
        ledger.record(
            poison if n == 2 else record(n, model="b", key="k", day=DAY, prompt=1, completion=1)
        )
    with caplog.at_level(logging.ERROR, logger="app.usage"):
        assert await ledger.flush() == 2
    assert counted("rejected") == rejected + 1
    assert ledger.pending == 0
    assert any('"request_id": "r2"' in r.getMessage() for r in caplog.records)  # replayable
    ledger.record(record(4, model="b", key="k", day=DAY, prompt=1, completion=1))
    assert await ledger.flush() == 1
    assert await total_requests(sessions) == 3


async def test_a_record_written_twice_is_billed_once(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    # A write reported failed after it committed is retried; the retry must not bill twice
    # nor be taken for a poison record.
    ledger = UsageLedger(sessions)
    first = record(1, model="b", key="k", day=DAY, prompt=1, completion=1)
    ledger.record(first)
    await ledger.flush()
    duplicate, rejected = counted("duplicate"), counted("rejected")
    ledger.record(first)
    ledger.record(record(2, model="b", key="k", day=DAY, prompt=1, completion=1))
    assert await ledger.flush() == 1
    assert (counted("duplicate"), counted("rejected")) == (duplicate + 1, rejected)
    assert await total_requests(sessions) == 2


@pytest.fixture
async def down_sessions(
    database_url: str, tmp_path: Path
) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    """Sessions on a store of the same kind that cannot be reached."""
    if database_url.startswith("sqlite"):
        url = f"sqlite+aiosqlite:///{tmp_path / 'absent' / 'store.db'}"
    else:
        url = f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/absent"
    engine = create_async_engine(url)
    yield async_sessionmaker(engine)
    await engine.dispose()


async def test_while_the_store_is_down_the_backlog_is_kept_bounded_and_logged(
    down_sessions: async_sessionmaker[AsyncSession], caplog: pytest.LogCaptureFixture
) -> None:
    ledger = UsageLedger(down_sessions, backlog_max=3, close_timeout=5)
    others = pending_gauge()  # ledgers of earlier tests not yet closed
    dropped = counted("dropped")
    with caplog.at_level(logging.ERROR, logger="app.usage"):
        for n in range(5):
            ledger.record(record(n, model="b", key="k", day=DAY, prompt=1, completion=1))
        for _ in range(2):
            with pytest.raises(Exception):  # noqa: B017 - whatever the driver raises
                await ledger.flush()
        assert (ledger.pending, pending_gauge() - others) == (3, 3)
        assert counted("dropped") == dropped + 2  # the two oldest
        logged = counted("logged")
        await ledger.close()  # still down at shutdown: what is left goes to the log
    full = [r.getMessage() for r in caplog.records if "backlog full" in r.getMessage()]
    # At once when it starts, then at most once a minute, and at shutdown.
    assert len(full) == 2
    assert "r0 to r0" in full[0] and "r1 to r1" in full[1]
    unwritten = [
        r.getMessage()
        for r in caplog.records
        if r.getMessage().startswith("unwritten usage record ")
    ]
    assert [
        json.loads(m.removeprefix("unwritten usage record "))["request_id"] for m in unwritten
    ] == [
        "r2",
        "r3",
        "r4",
    ]
    assert counted("logged") == logged + 3
    assert (ledger.pending, pending_gauge() - others) == (0, 0)


async def test_ledgers_in_one_process_add_up_in_the_pending_gauge(
    down_sessions: async_sessionmaker[AsyncSession],
) -> None:
    before = pending_gauge()
    first, second = UsageLedger(down_sessions), UsageLedger(down_sessions)
    first.record(record(1, model="b", key="k", day=DAY, prompt=1, completion=1))
    second.record(record(2, model="b", key="k", day=DAY, prompt=1, completion=1))
    second.record(record(3, model="b", key="k", day=DAY, prompt=1, completion=1))
    assert pending_gauge() - before == 3
    await first.close()  # the store is down: its one record goes to the log
    assert pending_gauge() - before == 2
    await second.close()
    assert pending_gauge() == before


async def test_records_wait_while_postgres_starts_up() -> None:
    # Its "starting up" refusal reaches SQLAlchemy as a generic DBAPIError: the records are
    # kept for the next write, not set aside as records the store rejected.
    async with postgres_starting_up() as url:
        engine = create_async_engine(url)
        ledger = UsageLedger(async_sessionmaker(engine))
        rejected = counted("rejected")
        ledger.record(record(1, model="b", key="k", day=DAY, prompt=1, completion=1))
        with pytest.raises(DBAPIError) as raised:
            await ledger.flush()
        await engine.dispose()
    assert "starting up" in str(raised.value)
    assert store_is_down(raised.value)
    assert (ledger.pending, counted("rejected")) == (1, rejected)


def test_store_down_or_record_refused() -> None:
    assert store_is_down(OperationalError("INSERT", {}, Exception("database is locked")))
    assert store_is_down(ConnectionRefusedError())
    assert not store_is_down(IntegrityError("INSERT", {}, Exception("NOT NULL")))
    assert not store_is_down(OverflowError("int too large"))


# -- a record's fields, as the ledger inserts and logs them ---------------------------------------


def test_as_dict_is_every_field_by_name() -> None:
    now = datetime(2026, 12, 1, tzinfo=timezone.utc)
    record = UsageRecord(
        request_id="r",
        tenant_id="t",
        tenant_uid="u1",
        key_id="k",
        endpoint="chat",
        model="m",
        adapter="a",
        adapter_version=2,
        prompt_tokens=3,
        completion_tokens=4,
        status="ok",
        latency_ms=5,
        started_at=now,
        finished_at=now,
        user="u",
    )
    assert record.as_dict() == dataclasses.asdict(record)
    assert record.as_dict()["started_at"] is now
