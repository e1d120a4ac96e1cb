"""What only the shared Redis backend has: replicas, an unreachable store, Lua, key expiry."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from importlib import resources

import pytest
from redis.asyncio import Redis

from app.quota import Limits, QuotaBackendUnavailable, QuotaExceeded
from app.quota.limits import period_id
from app.quota.redis import RedisBackend
from tests.support.quota import TENANT, crowd
from tests.support.servers import free_port


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:12]}:"


@pytest.fixture
async def replicas(redis_url: str, prefix: str) -> AsyncIterator[list[RedisBackend]]:
    """Two gateway replicas sharing one Redis, each with its own connections."""
    backends = [RedisBackend.from_url(redis_url, key_prefix=prefix) for _ in range(2)]
    yield backends
    for backend in backends:
        await backend.close()


async def test_two_replicas_enforce_one_limit(replicas: list[RedisBackend]) -> None:
    admitted, _ = await crowd(replicas, [(TENANT, Limits(requests_per_minute=15))], 1, 40)
    assert len(admitted) == 15
    assert len({r.id for r in admitted}) == 15
    subjects = [("tenant:other", Limits(max_concurrent=3, tokens_per_minute=1000))]
    admitted, _ = await crowd(replicas, subjects, 100, 20)
    assert len(admitted) == 3
    await replicas[1].reconcile(admitted[0], 10)  # settled by a replica that did not admit it
    usage = await replicas[0].usage("tenant:other", subjects[0][1])
    assert usage.concurrent == 2
    assert usage.tokens == pytest.approx(210, abs=5)


async def test_unreachable_redis_fails_open_when_told_to(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = RedisBackend.from_url(f"redis://127.0.0.1:{free_port()}/0", fail_open=True)
    limits = [(TENANT, Limits(requests_per_minute=1, max_concurrent=1))]
    with caplog.at_level(logging.DEBUG, logger="app.quota"):
        first = await backend.reserve(limits, 10)
        second = await backend.reserve(limits, 10)  # the RPM of 1 was not checked
    assert first.unchecked and second.unchecked
    assert dict(first.headers) == {}
    await backend.reconcile(first, 10)
    assert await backend.renew(second)
    # The quota's own (caplog takes every logger's, a gateway's on a thread included).
    errors = [
        r for r in caplog.records if r.levelno == logging.ERROR and r.name.startswith("app.quota")
    ]
    assert len(errors) == 1  # once per outage, not once per request
    assert "unreachable" in errors[0].getMessage()
    await backend.close()


async def test_unreachable_redis_fails_closed_by_default() -> None:
    backend = RedisBackend.from_url(f"redis://127.0.0.1:{free_port()}/0")
    limits = [(TENANT, Limits(requests_per_minute=1))]
    with pytest.raises(QuotaBackendUnavailable) as refused:
        await backend.reserve(limits, 10)
    assert refused.value.status_code == 503
    assert refused.value.body()["error"]["code"] == "quota_backend_unavailable"
    with pytest.raises(QuotaBackendUnavailable):
        await backend.usage(TENANT, limits[0][1])
    await backend.close()


async def test_every_key_expires(redis_url: str, prefix: str) -> None:
    backend = RedisBackend.from_url(redis_url, key_prefix=prefix, lease_seconds=5)
    limits = Limits(
        requests_per_minute=60,
        tokens_per_minute=1000,
        max_concurrent=2,
        token_budget=10_000,
        budget_period="month",
    )
    settled = await backend.reserve([(TENANT, limits)], 100)
    await backend.reconcile(settled, 50)
    await backend.reserve([(TENANT, limits)], 100)  # open: its record and lease remain
    await backend._void("lost", "an attempt", 100, [(TENANT, limits)])  # a void mark
    client = Redis.from_url(redis_url, decode_responses=True)
    keys = [key async for key in client.scan_iter(f"{prefix}*")]
    assert {key.split(":")[1] for key in keys} == {"rq", "tk", "cc", "bg", "rs", "vd"}
    for key in keys:
        assert await client.pttl(key) > 0, key
    assert await client.get(f"{prefix}bg:{TENANT}:{settled.charges[0].period}") == "150"
    await client.aclose()
    await backend.close()


async def test_lua_budget_periods_match_python(redis_url: str) -> None:
    start = datetime(1970, 1, 1, tzinfo=timezone.utc)
    moments = [start + timedelta(days=d, hours=d % 24) for d in range(0, 365 * 140, 7)]
    for year in (1999, 2000, 2024, 2025, 2100):  # month ends, leap and non-leap years
        for month in range(1, 13):
            first = datetime(year, month, 1, tzinfo=timezone.utc)
            moments += [first, first - timedelta(microseconds=1)]
    stamps = [round(m.timestamp() * 1_000_000) for m in moments]
    common = resources.files("app.quota").joinpath("lua/common.lua").read_text(encoding="utf-8")
    script = (
        common
        + "local out = {}\n"
        + "for i, t in ipairs(ARGV) do\n"
        + "  out[i] = period_id('day', tonumber(t)) .. ' ' .. period_id('month', tonumber(t))\n"
        + "end\n"
        + "return out\n"
    )
    client = Redis.from_url(redis_url, decode_responses=True)
    got = await client.eval(script, 0, *stamps)
    await client.aclose()
    assert got == [f"{period_id('day', t)} {period_id('month', t)}" for t in stamps]


async def test_a_refusal_across_replicas_reports_the_shared_state(
    replicas: list[RedisBackend],
) -> None:
    limits = [(TENANT, Limits(tokens_per_minute=600))]
    await replicas[0].reserve(limits, 600)
    with pytest.raises(QuotaExceeded) as refused:
        await replicas[1].reserve(limits, 60)
    assert refused.value.retry_after == pytest.approx(6.0, abs=0.3)
    assert refused.value.headers["x-ratelimit-remaining-tokens"] == "0"
