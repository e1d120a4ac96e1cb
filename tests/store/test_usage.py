"""The usage ledger on every store backend."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.usage import UsageLedger, UsageRecord, UsageTotal, usage_totals

DAY = datetime(2026, 11, 1, 12, tzinfo=timezone.utc)


def record(
    n: int, *, model: str, key: str, day: datetime, prompt: int, completion: int
) -> UsageRecord:
    return UsageRecord(
        request_id=f"r{n}",
        tenant_id="acme",
        key_id=key,
        endpoint="chat.completions",
        model=model,
        adapter=None if model == "base" else model,
        adapter_version=1,
        prompt_tokens=prompt,
        completion_tokens=completion,
        status="ok",
        latency_ms=5,
        started_at=day,
        finished_at=day + timedelta(seconds=1),
    )


async def test_records_are_written_in_batches_and_totalled(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    ledger = UsageLedger(sessions)
    ledger.record(record(1, model="legal", key="k1", day=DAY, prompt=10, completion=5))
    ledger.record(record(2, model="legal", key="k2", day=DAY, prompt=20, completion=7))
    ledger.record(
        record(3, model="base", key="k1", day=DAY + timedelta(days=1), prompt=1, completion=1)
    )
    assert await usage_totals(sessions, "acme", start=None, end=None, group_by=None) == [
        UsageTotal(None, 0, 0, 0)
    ]
    assert await ledger.flush() == 3
    assert await ledger.flush() == 0

    (total,) = await usage_totals(sessions, "acme", start=None, end=None, group_by=None)
    assert (total.requests, total.prompt_tokens, total.completion_tokens) == (3, 31, 13)
    by_adapter = await usage_totals(sessions, "acme", start=None, end=None, group_by="adapter")
    assert [(t.group, t.requests, t.prompt_tokens) for t in by_adapter] == [
        ("base", 1, 1),
        ("legal", 2, 30),
    ]
    by_key = await usage_totals(sessions, "acme", start=None, end=None, group_by="key")
    assert [(t.group, t.requests) for t in by_key] == [("k1", 2), ("k2", 1)]
    by_day = await usage_totals(sessions, "acme", start=None, end=None, group_by="day")
    assert [(t.group, t.requests) for t in by_day] == [("2026-11-01", 2), ("2026-11-02", 1)]
    window = await usage_totals(
        sessions, "acme", start=DAY + timedelta(hours=1), end=None, group_by=None
    )
    assert window[0].requests == 1
    assert (await usage_totals(sessions, "other", start=None, end=None, group_by=None))[
        0
    ].requests == 0
