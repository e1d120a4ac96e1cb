"""The in-process backend (``memory://``): one replica, state lost on restart.

Every operation runs to completion without awaiting, so check-and-commit is atomic under
asyncio; a lock makes it so across threads too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from app.quota.backend import PRECHECK_TOKENS, RECONCILE_WINDOW_S, VOID_MEMORY_S, QuotaBackend
from app.quota.bucket import Bucket, current, wait_seconds
from app.quota.limits import Limits, QuotaUsage, period_id
from app.quota.outcomes import Admitted, Levels, Refused, Reservation, Subjects, Violation


@dataclass
class _Plan:
    """What one subject's check found, kept to commit it without reading again."""

    requests: tuple[float, int] | None = None
    tokens: tuple[float, int] | None = None
    period: str | None = None
    budget_used: int = 0


@dataclass(frozen=True)
class _Open:
    """An open reservation: what voiding it needs to find what it charged."""

    until_us: int
    attempt: str
    at_us: int
    periods: tuple[str | None, ...]


class MemoryBackend(QuotaBackend):
    """Quota state in this process. ``clock`` (seconds since the epoch) is injectable for tests;
    budget periods follow its calendar date in UTC."""

    settles_in_place: ClassVar[bool] = True

    def __init__(
        self,
        *,
        fail_open: bool = False,
        lease_seconds: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(fail_open=fail_open, lease_seconds=lease_seconds)
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, str], Bucket] = {}
        self._leases: dict[str, dict[str, int]] = {}
        self._budgets: dict[str, tuple[str, int]] = {}
        # Open reservations by id, until they stop being reconcilable; voided ids, until they
        # may be used again. Each dict's entries share one
        # lifetime, so insertion order is expiry order.
        self._open: dict[str, _Open] = {}
        self._voided: dict[str, int] = {}

    def _now_us(self) -> int:
        return round(self._clock() * 1_000_000)

    async def _reserve(
        self, rid: str, attempt: str, tokens: int, subjects: Subjects
    ) -> Admitted | Refused:
        with self._lock:
            now = self._now_us()
            self._forget_stale(now)
            if rid in self._open or rid in self._voided:
                raise ValueError(f"reservation id {rid!r} is in use")
            plans, refused = self._check(subjects, tokens, now)
            if refused is not None:
                return refused

            lease_until = now + round(self.lease_seconds * 1_000_000)
            after: list[Levels] = []
            for (subject, limits), plan in zip(subjects, plans, strict=True):
                if plan.requests is not None:
                    level, drained = plan.requests
                    self._buckets["requests", subject] = Bucket(level + 1, now, drained)
                if plan.tokens is not None:
                    level, drained = plan.tokens
                    self._buckets["tokens", subject] = Bucket(level + tokens, now, drained)
                if limits.max_concurrent is not None:
                    self._leases.setdefault(subject, {})[rid] = lease_until
                if plan.period is not None:
                    self._budgets[subject] = (plan.period, plan.budget_used + tokens)
                after.append(
                    Levels(
                        None if plan.requests is None else plan.requests[0] + 1,
                        None if plan.tokens is None else plan.tokens[0] + tokens,
                    )
                )
            periods = tuple(plan.period for plan in plans)
            self._open[rid] = _Open(now + RECONCILE_WINDOW_S * 1_000_000, attempt, now, periods)
            return Admitted(now, periods, tuple(after))

    async def _void(self, rid: str, attempt: str, tokens: int, subjects: Subjects) -> bool:
        with self._lock:
            now = self._now_us()
            self._forget_stale(now)
            record = self._open.get(rid)
            if record is None:
                # Never reserved (or voided already): keep a late attempt from charging.
                self._voided.setdefault(rid, now + VOID_MEMORY_S * 1_000_000)
                return False
            if record.attempt != attempt:
                return False
            del self._open[rid]
            self._voided[rid] = now + VOID_MEMORY_S * 1_000_000
            for (subject, limits), period in zip(subjects, record.periods, strict=True):
                if (rpm := limits.requests_per_minute) is not None:
                    self._refund("requests", subject, rpm, 1, record.at_us, now)
                if (tpm := limits.tokens_per_minute) is not None:
                    self._refund("tokens", subject, tpm, tokens, record.at_us, now)
                self._leases.get(subject, {}).pop(rid, None)
                self._charge_budget(subject, period, -tokens)
            return True

    async def _precheck(self, subjects: Subjects) -> Refused | None:
        with self._lock:
            return self._check(subjects, PRECHECK_TOKENS, self._now_us())[1]

    def _check(
        self, subjects: Subjects, tokens: int, now: int
    ) -> tuple[list[_Plan], Refused | None]:
        """Every limit of every subject against a request of ``tokens``; charges nothing."""
        plans: list[_Plan] = []
        violations: list[Violation] = []
        for index, (subject, limits) in enumerate(subjects):
            plan = _Plan()
            plans.append(plan)
            if limits.requests_per_minute is not None:
                plan.requests = self._current("requests", subject, limits.requests_per_minute, now)
                wait = wait_seconds(plan.requests[0], 1, limits.requests_per_minute)
                if wait > 0:
                    violations.append(Violation(index, "requests", wait, plan.requests[0]))
            if limits.tokens_per_minute is not None:
                plan.tokens = self._current("tokens", subject, limits.tokens_per_minute, now)
                wait = wait_seconds(plan.tokens[0], tokens, limits.tokens_per_minute)
                if wait > 0:
                    violations.append(Violation(index, "tokens", wait, plan.tokens[0]))
            if limits.max_concurrent is not None:
                live = self._live_count(subject, limits.max_concurrent, now)
                if live >= limits.max_concurrent:
                    violations.append(Violation(index, "concurrent", None, live))
            if limits.token_budget is not None and limits.budget_period is not None:
                plan.period = period_id(limits.budget_period, now)
                plan.budget_used = self._budget_used(subject, plan.period)
                if plan.budget_used + tokens > limits.token_budget:
                    violations.append(Violation(index, "budget", None, plan.budget_used))
        if not violations:
            return plans, None
        return plans, Refused(tuple(violations), tuple(_levels(plan) for plan in plans))

    async def _reconcile(self, reservation: Reservation, actual_tokens: int) -> None:
        with self._lock:
            now = self._now_us()
            for charge in reservation.charges:
                leases = self._leases.get(charge.subject)
                if leases is not None:
                    leases.pop(reservation.id, None)
            if self._open.pop(reservation.id, None) is None:
                return
            delta = actual_tokens - reservation.tokens
            if delta == 0:
                return
            for charge in reservation.charges:
                tpm = charge.limits.tokens_per_minute
                if tpm is not None:
                    if delta > 0:
                        level, drained = self._current("tokens", charge.subject, tpm, now)
                        self._buckets["tokens", charge.subject] = Bucket(
                            level + delta, now, drained
                        )
                    else:
                        self._refund(
                            "tokens", charge.subject, tpm, -delta, reservation.reserved_at_us, now
                        )
                self._charge_budget(charge.subject, charge.period, delta)

    async def _renew(self, reservation: Reservation) -> bool:
        with self._lock:
            now = self._now_us()
            held = True
            for charge in reservation.charges:
                if charge.limits.max_concurrent is None:
                    continue
                leases = self._leases.get(charge.subject, {})
                if leases.get(reservation.id, 0) > now:
                    leases[reservation.id] = now + round(self.lease_seconds * 1_000_000)
                else:
                    leases.pop(reservation.id, None)
                    held = False
            return held

    async def _charge_refused(self, subjects: Subjects) -> None:
        with self._lock:
            now = self._now_us()
            for subject, limits in subjects:
                if (rpm := limits.requests_per_minute) is not None:
                    level, drained = self._current("requests", subject, rpm, now)
                    self._buckets["requests", subject] = Bucket(
                        min(level + 1, max(level, rpm)), now, drained
                    )

    async def _usage(self, subject: str, limits: Limits) -> QuotaUsage:
        with self._lock:
            now = self._now_us()
            requests = tokens = None
            if limits.requests_per_minute is not None:
                requests = self._current("requests", subject, limits.requests_per_minute, now)[0]
            if limits.tokens_per_minute is not None:
                tokens = self._current("tokens", subject, limits.tokens_per_minute, now)[0]
            concurrent = sum(1 for until in self._leases.get(subject, {}).values() if until > now)
            used = period = None
            if limits.token_budget is not None and limits.budget_period is not None:
                period = period_id(limits.budget_period, now)
                used = self._budget_used(subject, period)
            return QuotaUsage(requests, tokens, concurrent, used, period)

    async def _close(self) -> None:
        """Nothing to release."""

    # -- state -----------------------------------------------------------------------------------

    def _current(self, kind: str, subject: str, limit: int, now: int) -> tuple[float, int]:
        return current(self._buckets.get((kind, subject)), limit, now)

    def _refund(
        self, kind: str, subject: str, limit: int, amount: int, since_us: int, now: int
    ) -> None:
        """Take ``amount`` charged at ``since_us`` back out of a bucket, unless the bucket has
        emptied since: the charge has then drained away already."""
        level, drained = self._current(kind, subject, limit, now)
        if drained <= since_us:
            level = max(0.0, level - amount)
            self._buckets[kind, subject] = Bucket(level, now, now if level == 0 else drained)

    def _charge_budget(self, subject: str, period: str | None, delta: int) -> None:
        """Add ``delta`` (negative: a refund) to ``period``'s budget count, never below 0. A
        previous period's count no longer limits anything; it is left as it was."""
        stored = self._budgets.get(subject)
        if period is not None and stored is not None and stored[0] == period:
            self._budgets[subject] = (period, max(0, stored[1] + delta))

    def _live_count(self, subject: str, limit: int, now: int) -> int:
        """How many of ``subject``'s leases are live, as far as ``limit`` is concerned. Leases
        end with their requests; one outlives its request only when the request's process
        stopped renewing it, so the expired are swept only when their count could refuse: a
        sweep per request would read every live lease of the subject."""
        leases = self._leases.get(subject, {})
        if len(leases) >= limit:
            for rid in [rid for rid, until in leases.items() if until <= now]:
                del leases[rid]
        return len(leases)

    def _budget_used(self, subject: str, period: str) -> int:
        stored = self._budgets.get(subject)
        return stored[1] if stored is not None and stored[0] == period else 0

    def _forget_stale(self, now: int) -> None:
        while self._open:
            rid, record = next(iter(self._open.items()))
            if record.until_us > now:
                break
            del self._open[rid]
        while self._voided:
            rid, until = next(iter(self._voided.items()))
            if until > now:
                break
            del self._voided[rid]


def _levels(plan: _Plan) -> Levels:
    return Levels(
        None if plan.requests is None else plan.requests[0],
        None if plan.tokens is None else plan.tokens[0],
    )
