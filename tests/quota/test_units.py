"""The pieces without storage: limits, headers, errors, the URL factory; and the calendar, which
only the in-process backend's clock can move across midnight."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from app.admin.schemas import QuotaPut
from app.errors import BadRequestError
from app.quota import (
    Limits,
    QuotaBackendUnavailable,
    QuotaExceeded,
    QuotaTooLarge,
    backend_from_url,
)
from app.quota.headers import format_duration, rate_limit_headers, retry_headers
from app.quota.limits import BudgetPeriod, period_id
from app.quota.memory import MemoryBackend
from app.quota.redis import RedisBackend
from tests.support.quota import FakeClock


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.0201, "21ms"),
        (0.3, "300ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (6, "6s"),
        (59.999, "59.999s"),
        (360, "6m0s"),
        (361.25, "6m1.25s"),
        (3723, "1h2m3s"),
    ],
)
def test_durations_are_written_like_openai(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_retry_headers_round_up() -> None:
    assert retry_headers(0.3) == {"retry-after": "1", "retry-after-ms": "300"}
    assert retry_headers(1.0) == {"retry-after": "1", "retry-after-ms": "1000"}
    assert retry_headers(1.0004) == {"retry-after": "2", "retry-after-ms": "1001"}


def test_rate_limit_headers_pick_the_subject_with_least_left() -> None:
    headers = rate_limit_headers(requests=[(100, 10.0), (10, 5.0)], tokens=[])
    assert headers == {
        "x-ratelimit-limit-requests": "10",
        "x-ratelimit-remaining-requests": "5",
        "x-ratelimit-reset-requests": "30s",
    }
    assert rate_limit_headers([], []) == {}


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="positive"):
        Limits(requests_per_minute=0)
    with pytest.raises(ValueError, match="budget_period"):
        Limits(token_budget=10)
    assert Limits().unlimited
    assert not Limits(max_concurrent=1).unlimited


def test_limits_from_the_admin_quota() -> None:
    quota = QuotaPut(
        requests_per_minute=60,
        tokens_per_minute=1000,
        max_concurrent_requests=4,
        token_budget=10**6,
        budget_period="day",
    )
    assert Limits.from_quota(quota) == Limits(60, 1000, 4, 10**6, "day")
    assert Limits.from_quota(QuotaPut(token_budget=5)).budget_period == "month"
    assert Limits.from_quota(QuotaPut(budget_period="day")) == Limits()


def test_errors_render_like_openai() -> None:
    exceeded = QuotaExceeded(
        "m", limit="tokens", subject="s", retry_after=2.0, headers={"retry-after": "2"}
    )
    assert exceeded.status_code == 429
    assert exceeded.body()["error"] == {
        "message": "m",
        "type": "tokens",
        "param": None,
        "code": "rate_limit_exceeded",
    }
    spent = QuotaExceeded("m", limit="budget", subject="s", retry_after=None, headers={})
    assert (spent.body()["error"]["type"], spent.code) == ("insufficient_quota",) * 2
    too_large = QuotaTooLarge("m", limit="tokens", subject="s")
    assert isinstance(too_large, BadRequestError)
    assert too_large.status_code == 400
    assert QuotaBackendUnavailable().status_code == 503


async def test_backends_are_chosen_by_url() -> None:
    assert isinstance(backend_from_url("memory://"), MemoryBackend)
    redis = backend_from_url("redis://127.0.0.1:1/0", fail_open=True, lease_seconds=5)
    assert isinstance(redis, RedisBackend)
    assert (redis.fail_open, redis.lease_seconds) == (True, 5)
    await redis.close()
    with pytest.raises(ValueError, match="unsupported"):
        backend_from_url("memcached://localhost")
    with pytest.raises(ValueError, match="lease_seconds"):
        backend_from_url("memory://", lease_seconds=0)


def _at(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> float:
    return datetime(year, month, day, hour, minute, second, tzinfo=timezone.utc).timestamp()


def test_period_ids_are_utc_calendar_periods() -> None:
    midnight = round(_at(2024, 3, 1) * 1_000_000)
    assert period_id("day", midnight - 1) == "2024-02-29"
    assert period_id("day", midnight) == "2024-03-01"
    assert period_id("month", midnight - 1) == "2024-02"


def test_period_ids_asked_in_any_order_are_each_times_own() -> None:
    """The last period's bounds are kept: a time on either side of them, back or forth,
    still gets its own period."""
    base = round(_at(2023, 12, 31, 23, 59, 59) * 1_000_000)
    steps = [0, 1, 999_999, 1_000_000, -1, 86_400_000_000, 31 * 86_400_000_000, 5, -2]
    for period in ("day", "month"):
        for step in steps:
            now_us = base + step
            moment = datetime.fromtimestamp(now_us // 1_000_000, tz=timezone.utc)
            expected = moment.strftime("%Y-%m-%d" if period == "day" else "%Y-%m")
            assert period_id(period, now_us) == expected, (period, step)


@pytest.mark.parametrize(
    ("period", "before", "after"),
    [("day", (2026, 1, 1, 23, 59, 59), (2026, 1, 2)), ("month", (2026, 1, 31, 23), (2026, 2, 1))],
)
async def test_a_budget_renews_with_the_calendar_period(
    period: BudgetPeriod, before: tuple[int, ...], after: tuple[int, ...]
) -> None:
    clock = FakeClock(_at(*before))
    backend = MemoryBackend(clock=clock)
    limits = Limits(token_budget=100, budget_period=period)
    old = await backend.reserve([("t", limits)], 100)
    with pytest.raises(QuotaExceeded):
        await backend.reserve([("t", limits)], 1)
    clock.now = _at(*after)
    await backend.reserve([("t", limits)], 60)
    await backend.reconcile(old, 0)  # refunds the old period, not the new one
    with pytest.raises(QuotaExceeded):
        await backend.reserve([("t", limits)], 41)
    assert (await backend.usage("t", limits)).budget_used == 60
