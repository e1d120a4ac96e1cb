"""Usage and quota refusals in time buckets, on every store backend."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.store.tables import RefusalRow
from app.usage import BucketTotal, UsageLedger, usage_by_bucket
from app.usage.refusals import refusals_by_bucket
from tests.support.usage import ACME_UID, DAY, record

HOUR = 3600
START = int(DAY.timestamp()) - 30 * 60  # half past: buckets start where the report starts


@pytest.fixture
async def ledger(sessions: async_sessionmaker[AsyncSession]) -> UsageLedger:
    ledger = UsageLedger(sessions)
    for n, (model, key, at, prompt) in enumerate(
        [
            ("legal", "k1", DAY, 10),
            ("legal", "k2", DAY + timedelta(seconds=10), 20),
            ("base", "k1", DAY + timedelta(minutes=30), 5),  # the second bucket's first second
            ("legal", "k1", DAY + timedelta(minutes=150), 7),  # at the end: outside
        ]
    ):
        ledger.record(record(n, model=model, key=key, day=at, prompt=prompt, completion=1))
    shadow = record(10, model="legal", key="k1", day=DAY, prompt=100, completion=100)
    ledger.record(replace(shadow, shadow=True))
    other = record(11, model="legal", key="k9", day=DAY, prompt=1000, completion=1)
    ledger.record(replace(other, tenant_id="globex", tenant_uid="uid-of-globex"))
    await ledger.flush()
    return ledger


async def buckets(sessions: async_sessionmaker[AsyncSession], **options: object) -> list[tuple]:
    totals = await usage_by_bucket(
        sessions,
        ACME_UID,
        start=START,
        end=START + 3 * HOUR,
        width=HOUR,
        **options,  # type: ignore[arg-type]
    )
    return [
        (t.start - START, t.model, t.key_id, t.requests, t.prompt_tokens, t.completion_tokens)
        for t in totals
    ]


@pytest.mark.usefixtures("ledger")
async def test_buckets_start_where_the_report_does_and_leave_out_shadows_and_other_tenants(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    assert await buckets(sessions) == [(0, None, None, 2, 30, 2), (HOUR, None, None, 1, 5, 1)]
    everyone = await usage_by_bucket(sessions, None, start=START, end=START + HOUR, width=HOUR)
    assert everyone == [BucketTotal(START, None, None, 3, 1030, 3)]


@pytest.mark.usefixtures("ledger")
async def test_buckets_split_and_filtered_by_model_and_key(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    assert await buckets(sessions, group_by=["model"]) == [
        (0, "legal", None, 2, 30, 2),
        (HOUR, "base", None, 1, 5, 1),
    ]
    assert await buckets(sessions, group_by=["api_key_id"]) == [
        (0, None, "k1", 1, 10, 1),
        (0, None, "k2", 1, 20, 1),
        (HOUR, None, "k1", 1, 5, 1),
    ]
    assert await buckets(sessions, group_by=["model", "api_key_id"], models=["legal"]) == [
        (0, "legal", "k1", 1, 10, 1),
        (0, "legal", "k2", 1, 20, 1),
    ]
    assert await buckets(sessions, key_ids=["k2", "k9"]) == [(0, None, None, 1, 20, 1)]


@pytest.mark.usefixtures("ledger")
async def test_minute_buckets_count_each_second_once(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    start = int(DAY.timestamp())
    totals = await usage_by_bucket(sessions, ACME_UID, start=start, end=start + 3600, width=60)
    assert [(t.start - start, t.requests) for t in totals] == [(0, 2), (1800, 1)]


async def test_a_report_that_ends_before_it_starts_is_refused(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    with pytest.raises(ValueError, match="no buckets"):
        await usage_by_bucket(sessions, ACME_UID, start=10, end=5, width=60)


class StoppedWallClock:
    """The ``time`` module as the ledger sees it, its wall clock (``time()``) stopped at
    ``moment``; its other clocks run."""

    def __init__(self, moment: float) -> None:
        self.moment = moment

    def time(self) -> float:
        return self.moment

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


async def test_refusals_are_added_up_per_minute_across_writes_and_replicas(
    sessions: async_sessionmaker[AsyncSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every refusal counted in the same minute, half way through it: on the real clock a
    # minute may end between the first and the last (the flushes take a while on a busy
    # machine), and its refusals be counted in two.
    minute = int(DAY.timestamp())
    monkeypatch.setattr("app.usage.ledger.time", StoppedWallClock(minute + 30))
    replicas = [UsageLedger(sessions), UsageLedger(sessions)]
    for ledger in replicas:
        ledger.refused(ACME_UID, "acme", "requests")
        ledger.refused(ACME_UID, "acme", "requests")
        ledger.refused("uid-of-globex", "globex", "budget")
    await asyncio.gather(*(ledger.flush() for ledger in replicas))
    replicas[0].refused(ACME_UID, "acme", "tokens")
    await replicas[0].flush()
    async with sessions() as session:
        rows = (await session.scalars(select(RefusalRow).order_by(RefusalRow.limit))).all()
    assert [(r.tenant_id, r.limit, r.count) for r in rows] == [
        ("globex", "budget", 2),
        ("acme", "requests", 4),
        ("acme", "tokens", 1),
    ]
    start = minute - 3600
    assert await refusals_by_bucket(sessions, start=start, end=minute + 60, width=3600) == {
        minute: 7
    }
    assert await refusals_by_bucket(
        sessions, start=start, end=minute + 60, width=3600, tenant_uid=ACME_UID
    ) == {minute: 5}


async def test_refusals_wait_in_memory_while_the_store_is_down(
    sessions: async_sessionmaker[AsyncSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = UsageLedger(sessions)
    ledger.refused(ACME_UID, "acme", "requests")

    async def down(*_: object) -> None:
        raise OSError("the store is down")

    monkeypatch.setattr("app.usage.ledger.add_refusals", down)
    with pytest.raises(OSError):
        await ledger.flush()
    monkeypatch.undo()
    ledger.refused(ACME_UID, "acme", "requests")
    await ledger.flush()
    now = int(time.time())
    assert (
        sum((await refusals_by_bucket(sessions, start=now - 120, end=now + 60, width=60)).values())
        == 2
    )
