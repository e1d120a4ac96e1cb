"""The quota contract, on every backend (``backend_kind``: memory, redis)."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.quota import (
    Limits,
    QuotaBackend,
    QuotaBackendUnavailable,
    QuotaExceeded,
    QuotaTooLarge,
)
from app.quota.limits import period_id
from app.quota.outcomes import Admitted, Refused, Subjects
from tests.support.quota import KEY, TENANT, Clock, FakeClock, MakeBackend, crowd


def tolerance(clock: Clock, seconds: float) -> float:
    """How far a real clock may have moved on while the test ran."""
    return 0.0 if clock.exact else seconds


def holds(
    level: float | None, charge: float, since: float, per_minute: int | None, clock: Clock
) -> bool:
    """Whether a bucket of ``per_minute`` charged ``charge`` at ``since``
    (``time.monotonic()``) reads ``level`` now: on a real clock it has drained for as long as
    the test has run since (a loaded machine runs it slowly)."""
    assert level is not None and per_minute is not None
    drained = 0.0 if clock.exact else (time.monotonic() - since) * per_minute / 60
    return charge - drained - 1e-6 <= level <= charge + 1e-6


# -- exactly the limit under concurrency ---------------------------------------------------------


async def test_requests_per_minute_admits_exactly_the_limit(backend: QuotaBackend) -> None:
    admitted, refused = await crowd([backend], [(TENANT, Limits(requests_per_minute=20))], 1, 50)
    assert len(admitted) == 20
    assert len(refused) == 30
    assert {(e.limit, e.code, e.error_type) for e in refused} == {
        ("requests", "rate_limit_exceeded", "requests")
    }


async def test_tokens_per_minute_admits_exactly_the_limit(backend: QuotaBackend) -> None:
    admitted, refused = await crowd([backend], [(TENANT, Limits(tokens_per_minute=1000))], 100, 25)
    assert len(admitted) == 10
    assert {(e.limit, e.error_type) for e in refused} == {("tokens", "tokens")}


async def test_concurrency_admits_exactly_the_limit(backend: QuotaBackend) -> None:
    subjects = [(TENANT, Limits(max_concurrent=5))]
    admitted, refused = await crowd([backend], subjects, 10, 20)
    assert len(admitted) == 5
    assert {e.limit for e in refused} == {"concurrent"}
    await backend.reconcile(admitted[0], 10)
    again, _ = await crowd([backend], subjects, 10, 5)
    assert len(again) == 1
    assert (await backend.usage(TENANT, subjects[0][1])).concurrent == 5


async def test_the_tightest_subject_wins(backend: QuotaBackend) -> None:
    subjects = [(TENANT, Limits(requests_per_minute=100)), (KEY, Limits(requests_per_minute=3))]
    admitted, refused = await crowd([backend], subjects, 1, 10)
    assert len(admitted) == 3
    assert {e.subject for e in refused} == {KEY}


# -- a refusal consumes nothing ------------------------------------------------------------------

TENANT_LIMITS = Limits(
    requests_per_minute=100,
    tokens_per_minute=10_000,
    max_concurrent=10,
    token_budget=1_000_000,
    budget_period="day",
)


@pytest.mark.parametrize(
    "key_limits",
    [
        Limits(requests_per_minute=1),
        Limits(tokens_per_minute=150),
        Limits(max_concurrent=1),
        Limits(token_budget=150, budget_period="day"),
    ],
    ids=["requests", "tokens", "concurrent", "budget"],
)
async def test_a_refused_request_changes_no_counter(
    backend: QuotaBackend, key_limits: Limits
) -> None:
    subjects = [(TENANT, TENANT_LIMITS), (KEY, key_limits)]
    await backend.reserve(subjects, 100)
    tenant_before = await backend.usage(TENANT, TENANT_LIMITS)
    key_before = await backend.usage(KEY, key_limits)
    with pytest.raises(QuotaExceeded):
        await backend.reserve(subjects, 100)
    tenant_after = await backend.usage(TENANT, TENANT_LIMITS)
    key_after = await backend.usage(KEY, key_limits)
    assert tenant_after.requests == pytest.approx(tenant_before.requests, abs=0.05)
    assert tenant_after.tokens == pytest.approx(tenant_before.tokens, abs=5)
    assert tenant_before.requests == pytest.approx(1, abs=0.05)
    assert tenant_before.concurrent == tenant_after.concurrent == 1
    assert tenant_before.budget_used == tenant_after.budget_used == 100
    assert key_after.concurrent == key_before.concurrent
    assert key_after.budget_used == key_before.budget_used


async def test_a_subject_refused_by_one_limit_is_not_charged_by_its_others(
    backend: QuotaBackend,
) -> None:
    limits = Limits(
        requests_per_minute=100,
        tokens_per_minute=10_000,
        max_concurrent=10,
        token_budget=150,
        budget_period="month",
    )
    await backend.reserve([(TENANT, limits)], 100)
    with pytest.raises(QuotaExceeded) as refused:
        await backend.reserve([(TENANT, limits)], 100)
    assert refused.value.limit == "budget"
    usage = await backend.usage(TENANT, limits)
    assert usage.requests == pytest.approx(1, abs=0.05)
    assert usage.tokens == pytest.approx(100, abs=5)
    assert usage.concurrent == 1
    assert usage.budget_used == 100


# -- reconcile -----------------------------------------------------------------------------------


async def test_reconcile_refunds_unused_tokens(backend: QuotaBackend) -> None:
    limits = Limits(tokens_per_minute=1000, token_budget=10_000, budget_period="day")
    first = await backend.reserve([(TENANT, limits)], 800)
    with pytest.raises(QuotaExceeded) as refused:
        await backend.reserve([(TENANT, limits)], 300)
    assert refused.value.limit == "tokens"
    await backend.reconcile(first, 100)
    await backend.reserve([(TENANT, limits)], 300)
    usage = await backend.usage(TENANT, limits)
    assert usage.tokens == pytest.approx(400, abs=5)
    assert usage.budget_used == 400


async def test_reconcile_charges_actual_usage_beyond_the_reservation(
    backend: QuotaBackend,
) -> None:
    limits = Limits(tokens_per_minute=1000, token_budget=10_000, budget_period="day")
    reservation = await backend.reserve([(TENANT, limits)], 100)
    await backend.reconcile(reservation, 500)
    usage = await backend.usage(TENANT, limits)
    assert usage.tokens == pytest.approx(500, abs=5)
    assert usage.budget_used == 500


async def test_no_refund_once_the_charge_has_drained_away(
    backend: QuotaBackend, clock: Clock
) -> None:
    # 100 tokens a second: the first 50 are gone after 0.6 s, so refunding them later would
    # hand out tokens that the bucket has already given back.
    limits = Limits(tokens_per_minute=6000)
    early = await backend.reserve([(TENANT, limits)], 50)
    await clock.advance(0.6)
    await backend.reserve([(TENANT, limits)], 6000)
    await backend.reconcile(early, 0)
    with pytest.raises(QuotaExceeded):
        await backend.reserve([(TENANT, limits)], 40)


async def test_release_frees_the_slot_at_once_and_a_double_reconcile_is_harmless(
    backend: QuotaBackend,
) -> None:
    limits = Limits(
        max_concurrent=1, tokens_per_minute=1000, token_budget=10_000, budget_period="day"
    )
    first = await backend.reserve([(TENANT, limits)], 100)
    with pytest.raises(QuotaExceeded) as refused:
        await backend.reserve([(TENANT, limits)], 100)
    assert (refused.value.limit, refused.value.error_type) == ("concurrent", "requests")
    assert refused.value.headers["retry-after"] == "1"
    await backend.reconcile(first, 40)
    second = await backend.reserve([(TENANT, limits)], 100)
    settled = await backend.usage(TENANT, limits)
    await backend.reconcile(first, 40)
    await backend.reconcile(first, 0)
    again = await backend.usage(TENANT, limits)
    assert again.budget_used == settled.budget_used == 140
    assert again.tokens == pytest.approx(settled.tokens, abs=1)
    assert again.concurrent == 1
    with pytest.raises(QuotaExceeded):  # the second's slot was not freed by the repeat
        await backend.reserve([(TENANT, limits)], 100)
    await backend.reconcile(second, 100)
    await backend.reserve([(TENANT, limits)], 100)


# -- leases --------------------------------------------------------------------------------------


async def test_a_crashed_holders_lease_expires(make_backend: MakeBackend, clock: Clock) -> None:
    backend = make_backend(lease_seconds=0.5)
    limits = Limits(max_concurrent=1)
    crashed = await backend.reserve([(TENANT, limits)], 1)  # never reconciled
    with pytest.raises(QuotaExceeded):
        await backend.reserve([(TENANT, limits)], 1)
    await clock.advance(0.6)
    assert (await backend.usage(TENANT, limits)).concurrent == 0
    await backend.reserve([(TENANT, limits)], 1)
    await backend.reconcile(crashed, 1)  # late: must not free the new holder's slot
    with pytest.raises(QuotaExceeded):
        await backend.reserve([(TENANT, limits)], 1)


async def test_renew_keeps_a_live_lease(make_backend: MakeBackend, clock: Clock) -> None:
    backend = make_backend(lease_seconds=0.6)
    limits = Limits(max_concurrent=1)
    holder = await backend.reserve([(TENANT, limits)], 1)
    await clock.advance(0.35)
    assert await backend.renew(holder)
    await clock.advance(0.35)  # past the first lease, within the renewed one
    with pytest.raises(QuotaExceeded):
        await backend.reserve([(TENANT, limits)], 1)
    await backend.reconcile(holder, 1)
    await backend.reserve([(TENANT, limits)], 1)


async def test_only_a_reservation_under_a_concurrency_limit_holds_a_lease(
    backend: QuotaBackend,
) -> None:
    """What the tracker renews while a request runs: nothing, for a reservation that holds
    no lease."""
    capped = await backend.reserve([(TENANT, Limits(max_concurrent=5)), (KEY, Limits())], 1)
    paced = await backend.reserve([(TENANT, Limits(tokens_per_minute=100))], 1)
    assert capped.leased and not paced.leased


async def test_renew_does_not_revive_an_expired_lease(
    make_backend: MakeBackend, clock: Clock
) -> None:
    backend = make_backend(lease_seconds=0.3)
    limits = Limits(max_concurrent=1)
    holder = await backend.reserve([(TENANT, limits)], 1)
    await clock.advance(0.4)
    assert not await backend.renew(holder)
    assert (await backend.usage(TENANT, limits)).concurrent == 0
    await backend.reserve([(TENANT, limits)], 1)


# -- budget and oversized requests ---------------------------------------------------------------


async def test_the_budget_stops_exactly_at_the_cap(backend: QuotaBackend, clock: Clock) -> None:
    limits = Limits(token_budget=1000, budget_period="day")
    for _ in range(3):
        await backend.reserve([(TENANT, limits)], 300)
    with pytest.raises(QuotaExceeded) as refused:
        await backend.reserve([(TENANT, limits)], 300)
    error = refused.value
    assert (error.status_code, error.code, error.error_type) == (
        429,
        "insufficient_quota",
        "insufficient_quota",
    )
    assert error.headers["x-should-retry"] == "false"
    assert "retry-after" not in error.headers
    assert TENANT in error.message
    await backend.reserve([(TENANT, limits)], 100)  # exactly the cap
    with pytest.raises(QuotaExceeded):
        await backend.reserve([(TENANT, limits)], 1)
    usage = await backend.usage(TENANT, limits)
    assert usage.budget_used == 1000
    now = clock.now if isinstance(clock, FakeClock) else time.time()
    assert usage.budget_period == period_id("day", round(now * 1e6))


@pytest.mark.parametrize(
    ("limits", "tokens", "limit"),
    [
        (Limits(tokens_per_minute=100), 101, "tokens"),
        (Limits(token_budget=50, budget_period="month"), 51, "budget"),
    ],
)
async def test_a_request_larger_than_the_limit_itself_is_a_400(
    backend: QuotaBackend, limits: Limits, tokens: int, limit: str
) -> None:
    with pytest.raises(QuotaTooLarge) as refused:
        await backend.reserve([(TENANT, limits)], tokens)
    assert (refused.value.status_code, refused.value.code) == (400, "request_too_large")
    assert refused.value.limit == limit
    assert TENANT in refused.value.message
    assert (await backend.usage(TENANT, limits)).concurrent == 0
    await backend.reserve([(TENANT, limits)], tokens - 1)


# -- GCRA: smooth, with an exact Retry-After -----------------------------------------------------


async def test_after_the_burst_admissions_are_spread_evenly(
    backend: QuotaBackend, clock: Clock
) -> None:
    limits = [(TENANT, Limits(requests_per_minute=60))]
    admitted, _ = await crowd([backend], limits, 1, 60)
    assert len(admitted) == 60
    with pytest.raises(QuotaExceeded) as refused:
        await backend.reserve(limits, 1)
    error = refused.value
    assert error.retry_after == pytest.approx(1.0, abs=tolerance(clock, 0.3))
    assert error.headers["retry-after"] == "1"  # not a minute-window reset
    await clock.advance(0.5)
    with pytest.raises(QuotaExceeded) as refused:
        await backend.reserve(limits, 1)
    if clock.exact:
        assert refused.value.retry_after == 0.5
        assert refused.value.headers["retry-after-ms"] == "500"
    assert refused.value.headers["retry-after"] == "1"
    await clock.advance(0.5)
    await backend.reserve(limits, 1)
    with pytest.raises(QuotaExceeded) as refused:
        await backend.reserve(limits, 1)
    assert refused.value.retry_after == pytest.approx(1.0, abs=tolerance(clock, 0.3))


async def test_retry_after_is_the_exact_wait_for_tokens(
    backend: QuotaBackend, clock: Clock
) -> None:
    limits = [(TENANT, Limits(tokens_per_minute=600))]  # 10 tokens a second
    await backend.reserve(limits, 600)
    with pytest.raises(QuotaExceeded) as refused:
        await backend.reserve(limits, 50)
    error = refused.value
    assert (error.limit, error.error_type) == ("tokens", "tokens")
    assert error.retry_after == pytest.approx(5.0, abs=tolerance(clock, 0.3))
    assert error.headers["retry-after"] == "5"
    if clock.exact:
        assert error.headers["retry-after-ms"] == "5000"
    assert "Limit 600" in error.message
    assert "Requested 50" in error.message


# -- headers -------------------------------------------------------------------------------------


async def test_headers_describe_the_tightest_subject(backend: QuotaBackend) -> None:
    subjects = [
        (TENANT, Limits(requests_per_minute=100, tokens_per_minute=10_000)),
        (KEY, Limits(requests_per_minute=10)),
    ]
    reservation = await backend.reserve(subjects, 250)
    assert dict(reservation.headers) == {
        "x-ratelimit-limit-requests": "10",
        "x-ratelimit-remaining-requests": "9",
        "x-ratelimit-reset-requests": "6s",
        "x-ratelimit-limit-tokens": "10000",
        "x-ratelimit-remaining-tokens": "9750",
        "x-ratelimit-reset-tokens": "1.5s",
    }
    for _ in range(9):
        await backend.reserve(subjects, 1)
    with pytest.raises(QuotaExceeded) as refused:
        await backend.reserve(subjects, 1)
    headers = refused.value.headers
    assert headers["x-ratelimit-limit-requests"] == "10"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["retry-after"] == "6"
    assert refused.value.subject == KEY


async def test_unset_limits_have_no_headers(backend: QuotaBackend) -> None:
    reservation = await backend.reserve([(TENANT, Limits(max_concurrent=5))], 10)
    assert dict(reservation.headers) == {}
    reservation = await backend.reserve([(TENANT, Limits(tokens_per_minute=100))], 10)
    assert set(reservation.headers) == {
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    }


# -- arguments -----------------------------------------------------------------------------------


async def test_reservation_ids_and_subjects_must_be_unique(backend: QuotaBackend) -> None:
    limits = Limits(max_concurrent=5)
    first = await backend.reserve([(TENANT, limits)], 1, reservation_id="r-1")
    assert first.id == "r-1"
    assert first.subjects == (TENANT,)
    with pytest.raises(ValueError, match="in use"):
        await backend.reserve([(TENANT, limits)], 1, reservation_id="r-1")
    with pytest.raises(ValueError, match="duplicate"):
        await backend.reserve([(TENANT, limits), (TENANT, limits)], 1)
    with pytest.raises(ValueError):
        await backend.reserve([(TENANT, limits)], -1)
    assert (await backend.usage(TENANT, limits)).concurrent == 1


async def test_no_subjects_or_no_limits_admit(backend: QuotaBackend) -> None:
    reservation = await backend.reserve([], 10)
    await backend.reconcile(reservation, 10)
    unlimited = await backend.reserve([(TENANT, Limits())], 10**9)
    assert dict(unlimited.headers) == {}
    assert await backend.renew(unlimited)
    await backend.reconcile(unlimited, 5)


# -- precheck: refuse early what reserve would refuse, commit nothing ----------------------------


async def test_precheck_commits_nothing(backend: QuotaBackend, clock: Clock) -> None:
    key_limits = Limits(requests_per_minute=2, max_concurrent=2)
    subjects = [(TENANT, TENANT_LIMITS), (KEY, key_limits)]
    for _ in range(5):
        await backend.precheck(subjects)
    usage = await backend.usage(TENANT, TENANT_LIMITS)
    assert (usage.requests, usage.tokens, usage.concurrent, usage.budget_used) == (0, 0, 0, 0)
    assert (await backend.usage(KEY, key_limits)).concurrent == 0
    # A precheck before each reservation changes nothing: the key's two requests still fit.
    since = time.monotonic()
    for _ in range(2):
        await backend.precheck(subjects)
        await backend.reserve(subjects, 100)
    with pytest.raises(QuotaExceeded) as reserve_refused:
        await backend.reserve(subjects, 100)
    with pytest.raises(QuotaExceeded) as precheck_refused:
        await backend.precheck(subjects)
    for refused in (reserve_refused.value, precheck_refused.value):
        assert (refused.limit, refused.subject) == ("requests", KEY)
    assert set(reserve_refused.value.headers) == set(precheck_refused.value.headers)
    if clock.exact:  # a real clock moves on between the two refusals
        assert reserve_refused.value.message == precheck_refused.value.message
        assert reserve_refused.value.headers == precheck_refused.value.headers
    usage = await backend.usage(TENANT, TENANT_LIMITS)
    assert holds(usage.requests, 2, since, TENANT_LIMITS.requests_per_minute, clock)
    assert usage.budget_used == 200


@pytest.mark.parametrize(
    ("key_limits", "first", "limit"),
    [
        (Limits(requests_per_minute=1), 10, "requests"),
        (Limits(max_concurrent=1), 10, "concurrent"),
        (Limits(tokens_per_minute=100), 100, "tokens"),
        (Limits(token_budget=100, budget_period="day"), 100, "budget"),
    ],
    ids=["requests", "concurrent", "tokens", "budget"],
)
async def test_precheck_refuses_a_limit_already_reached(
    backend: QuotaBackend, key_limits: Limits, first: int, limit: str
) -> None:
    subjects = [(TENANT, TENANT_LIMITS), (KEY, key_limits)]
    await backend.precheck(subjects)
    holder = await backend.reserve(subjects, first)
    with pytest.raises(QuotaExceeded) as refused:
        await backend.precheck(subjects)
    error = refused.value
    assert (error.status_code, error.limit, error.subject) == (429, limit, KEY)
    if limit == "budget":
        assert error.headers["x-should-retry"] == "false"
        assert error.code == "insufficient_quota"
    else:
        assert int(error.headers["retry-after"]) >= 1
        assert error.code == "rate_limit_exceeded"
    assert "Requested" not in error.message or limit == "requests"
    if limit == "concurrent":
        await backend.reconcile(holder, first)
        await backend.precheck(subjects)  # the slot is free again


@pytest.mark.parametrize(
    "key_limits",
    [Limits(tokens_per_minute=100), Limits(token_budget=100, budget_period="month")],
    ids=["tokens", "budget"],
)
async def test_precheck_passes_while_one_token_still_fits(
    backend: QuotaBackend, key_limits: Limits
) -> None:
    subjects = [(KEY, key_limits)]
    await backend.reserve(subjects, 99)
    await backend.precheck(subjects)
    with pytest.raises(QuotaExceeded):
        await backend.reserve(subjects, 2)  # reserve, knowing the size, still decides


async def test_precheck_without_subjects_or_limits_passes(backend: QuotaBackend) -> None:
    await backend.precheck([])
    await backend.precheck([(TENANT, Limits())])
    with pytest.raises(ValueError, match="duplicate"):
        await backend.precheck([(TENANT, Limits()), (TENANT, Limits())])


# -- a reservation whose reply was lost is voided ------------------------------------------------

LOST_KEY_LIMITS = Limits(requests_per_minute=5, max_concurrent=2)


def lose_replies(backend: QuotaBackend, loss: str) -> list[tuple[str, str, int, Subjects]]:
    """Make the store apply each reservation and then lose its reply: a timeout, or a reply
    still in flight (the caller is cancelled while it waits). Returns the attempts' arguments."""
    reserve = backend._reserve
    attempts: list[tuple[str, str, int, Subjects]] = []

    async def lossy(rid: str, attempt: str, tokens: int, subjects: Subjects) -> Admitted | Refused:
        outcome = await reserve(rid, attempt, tokens, subjects)
        attempts.append((rid, attempt, tokens, subjects))
        if loss == "timeout":
            raise QuotaBackendUnavailable(reason="timeout")
        await asyncio.Event().wait()  # the reply never comes
        return outcome

    backend._reserve = lossy  # type: ignore[method-assign]
    return attempts


@pytest.mark.parametrize(
    ("loss", "fail_open"),
    [("timeout", False), ("timeout", True), ("cancelled", False)],
    ids=["timeout", "timeout-fail-open", "cancelled"],
)
async def test_a_reservation_whose_reply_was_lost_charges_nothing(
    make_backend: MakeBackend, clock: Clock, loss: str, fail_open: bool
) -> None:
    backend = make_backend(fail_open=fail_open)
    subjects = [(TENANT, TENANT_LIMITS), (KEY, LOST_KEY_LIMITS)]
    charged = time.monotonic()
    kept = await backend.reserve(subjects, 100)  # answered: it stays charged
    attempts = lose_replies(backend, loss)
    if loss == "timeout" and fail_open:
        assert (await backend.reserve(subjects, 5000)).unchecked
    elif loss == "timeout":
        with pytest.raises(QuotaBackendUnavailable):
            await backend.reserve(subjects, 5000)
    else:
        lost = asyncio.create_task(backend.reserve(subjects, 5000))
        while not attempts:
            await asyncio.sleep(0.001)
        lost.cancel()
        with pytest.raises(asyncio.CancelledError):
            await lost
    await backend.drain()
    assert len(attempts) == 1
    # The answered reservation alone, less what the buckets drained since.
    tenant = await backend.usage(TENANT, TENANT_LIMITS)
    assert holds(tenant.requests, 1, charged, TENANT_LIMITS.requests_per_minute, clock)
    assert holds(tenant.tokens, 100, charged, TENANT_LIMITS.tokens_per_minute, clock)
    assert (tenant.concurrent, tenant.budget_used) == (1, 100)
    key = await backend.usage(KEY, LOST_KEY_LIMITS)
    assert holds(key.requests, 1, charged, LOST_KEY_LIMITS.requests_per_minute, clock)
    assert key.concurrent == 1
    # Voiding again changes nothing, and the reservation that was answered settles as usual.
    assert not await backend._void(*attempts[0])
    await backend.reconcile(kept, 40)
    tenant = await backend.usage(TENANT, TENANT_LIMITS)
    assert (tenant.concurrent, tenant.budget_used) == (0, 40)
    assert holds(tenant.requests, 1, charged, TENANT_LIMITS.requests_per_minute, clock)


async def test_a_void_keeps_a_reserve_landing_after_it_from_charging(
    backend: QuotaBackend,
) -> None:
    subjects = [(TENANT, TENANT_LIMITS), (KEY, LOST_KEY_LIMITS)]
    # The void of an attempt that has not reached the store yet finds nothing to undo...
    assert not await backend._void("r-late", "attempt-1", 100, subjects)
    assert not await backend._void("r-late", "attempt-1", 100, subjects)
    # ... and the attempt, when it lands, charges nothing.
    with pytest.raises(ValueError, match="in use"):
        await backend._reserve("r-late", "attempt-1", 100, subjects)
    usage = await backend.usage(TENANT, TENANT_LIMITS)
    assert (usage.requests, usage.tokens, usage.concurrent, usage.budget_used) == (0, 0, 0, 0)


async def test_a_void_leaves_another_attempts_reservation_alone(backend: QuotaBackend) -> None:
    subjects = [(TENANT, TENANT_LIMITS)]
    held = await backend.reserve(subjects, 100, reservation_id="r-1")
    assert not await backend._void("r-1", "someone-elses-attempt", 100, subjects)
    usage = await backend.usage(TENANT, TENANT_LIMITS)
    assert (usage.concurrent, usage.budget_used) == (1, 100)
    await backend.reconcile(held, 40)
    assert (await backend.usage(TENANT, TENANT_LIMITS)).budget_used == 40


# -- a request refused after it was read (a 400) counts against requests per minute --------------


async def test_a_refused_request_counts_one_request_and_nothing_else(
    backend: QuotaBackend,
) -> None:
    key_limits = Limits(requests_per_minute=3, max_concurrent=1)
    subjects = [(TENANT, TENANT_LIMITS), (KEY, key_limits)]
    await backend.charge_refused(subjects)
    tenant = await backend.usage(TENANT, TENANT_LIMITS)
    assert tenant.requests == pytest.approx(1, abs=0.05)
    assert (tenant.tokens, tenant.concurrent, tenant.budget_used) == (0, 0, 0)
    assert (await backend.usage(KEY, key_limits)).concurrent == 0
    await backend.charge_refused(subjects)
    await backend.precheck(subjects)
    await backend.reserve(subjects, 100)  # the key's third request
    with pytest.raises(QuotaExceeded) as prechecked:
        await backend.precheck(subjects)
    with pytest.raises(QuotaExceeded) as reserved:
        await backend.reserve(subjects, 100)
    for refused in (prechecked.value, reserved.value):
        assert (refused.limit, refused.subject) == ("requests", KEY)
    tenant = await backend.usage(TENANT, TENANT_LIMITS)
    assert tenant.requests == pytest.approx(3, abs=0.05)
    assert tenant.tokens == pytest.approx(100, abs=5)
    assert (tenant.concurrent, tenant.budget_used) == (1, 100)


async def test_a_refused_request_does_not_push_a_full_limit_past_it(
    backend: QuotaBackend, clock: Clock
) -> None:
    limits = [(TENANT, Limits(requests_per_minute=2))]
    for _ in range(2):
        await backend.reserve(limits, 1)
    await backend.charge_refused(limits)
    with pytest.raises(QuotaExceeded) as refused:
        await backend.reserve(limits, 1)
    # One request's wait at 2 a minute, as without the refusal; not two.
    assert refused.value.retry_after == pytest.approx(30.0, abs=tolerance(clock, 0.5))


async def test_a_refused_request_without_a_requests_limit_counts_nowhere(
    backend: QuotaBackend,
) -> None:
    limits = Limits(tokens_per_minute=100, max_concurrent=1)
    await backend.charge_refused([(TENANT, limits)])
    await backend.charge_refused([])
    usage = await backend.usage(TENANT, limits)
    assert (usage.requests, usage.tokens, usage.concurrent) == (None, 0, 0)
    with pytest.raises(ValueError, match="duplicate"):
        await backend.charge_refused([(TENANT, limits), (TENANT, limits)])


async def test_a_refusal_names_the_tenant_not_its_incarnation(backend: QuotaBackend) -> None:
    subject = "acme@0f3c9a1e"  # Tenant.quota_subject: the id, then the incarnation's uid
    limits = Limits(requests_per_minute=1, token_budget=10, budget_period="day")
    await backend.reserve([(subject, limits)], 1)
    messages = []
    for tokens in (1, 11):  # past the rate; larger than the budget
        with pytest.raises((QuotaExceeded, QuotaTooLarge)) as refused:
            await backend.reserve([(subject, limits)], tokens)
        messages.append(refused.value.message)
    for message in messages:
        assert "acme" in message and "0f3c9a1e" not in message and "@" not in message, message
