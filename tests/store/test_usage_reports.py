"""Usage in time buckets, on every store backend."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.usage import BucketTotal, UsageLedger, usage_by_bucket
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
