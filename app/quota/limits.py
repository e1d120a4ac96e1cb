"""What a subject may use (:class:`Limits`), what it has used (:class:`QuotaUsage`), and
budget periods."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Literal, Protocol

BudgetPeriod = Literal["day", "month"]


class QuotaSettings(Protocol):
    """Anything shaped like the admin API's ``QuotaPut`` or the store's ``QuotaRow``."""

    @property
    def requests_per_minute(self) -> int | None: ...
    @property
    def tokens_per_minute(self) -> int | None: ...
    @property
    def max_concurrent_requests(self) -> int | None: ...
    @property
    def token_budget(self) -> int | None: ...
    @property
    def budget_period(self) -> str | None: ...


@dataclass(frozen=True)
class Limits:
    """One subject's limits; ``None`` means unlimited.

    ``token_budget`` is a hard cap on tokens per calendar ``budget_period`` in UTC and needs one.
    """

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None
    token_budget: int | None = None
    budget_period: BudgetPeriod | None = None

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute", "max_concurrent", "token_budget"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, not {value!r}")
        if self.budget_period not in (None, "day", "month"):
            raise ValueError(f"budget_period must be 'day' or 'month', not {self.budget_period!r}")
        if self.token_budget is not None and self.budget_period is None:
            raise ValueError("token_budget needs a budget_period ('day' or 'month')")

    @classmethod
    def from_quota(cls, quota: QuotaSettings) -> Limits:
        """Limits from stored quota settings; a budget stored without a period is monthly."""
        period: BudgetPeriod | None
        if quota.token_budget is None:
            period = None
        elif quota.budget_period in (None, "month"):
            period = "month"
        elif quota.budget_period == "day":
            period = "day"
        else:
            raise ValueError(f"unknown budget period {quota.budget_period!r}")
        return cls(
            requests_per_minute=quota.requests_per_minute,
            tokens_per_minute=quota.tokens_per_minute,
            max_concurrent=quota.max_concurrent_requests,
            token_budget=quota.token_budget,
            budget_period=period,
        )

    @property
    def unlimited(self) -> bool:
        return (
            self.requests_per_minute is None
            and self.tokens_per_minute is None
            and self.max_concurrent is None
            and self.token_budget is None
        )


@dataclass(frozen=True)
class QuotaUsage:
    """A subject's current consumption, as its limits measure it.

    ``requests`` and ``tokens`` are the rate limiters' levels: how much of the per-minute
    allowance is in use now (it drains continuously); ``None`` where that limit is unset.
    ``concurrent`` counts live concurrency leases. ``budget_used`` is what the current budget
    period has charged, ``None`` without a budget.
    """

    requests: float | None
    tokens: float | None
    concurrent: int
    budget_used: int | None
    budget_period: str | None


def period_id(period: BudgetPeriod, now_us: int) -> str:
    """The calendar period (UTC) containing ``now_us``: ``2025-01-31`` or ``2025-01``.

    ``lua/common.lua`` computes the same ids; the suite checks that they agree. Each
    request asks several times: the last period's bounds are kept, and a time inside them
    costs two comparisons.
    """
    start_us, end_us, known = _last_period[period]
    if start_us <= now_us < end_us:
        return known
    moment = datetime.fromtimestamp(now_us // 1_000_000, tz=timezone.utc)
    start = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        end = start + timedelta(days=1)
    else:
        start = start.replace(day=1)
        end = (start + timedelta(days=32)).replace(day=1)
    known = moment.strftime("%Y-%m-%d" if period == "day" else "%Y-%m")
    _last_period[period] = (_epoch_us(start), _epoch_us(end), known)
    return known


def _epoch_us(moment: datetime) -> int:
    return int(moment.timestamp()) * 1_000_000


_last_period: dict[BudgetPeriod, tuple[int, int, str]] = {"day": (0, 0, ""), "month": (0, 0, "")}
"""Per period kind, the bounds (microseconds, end excluded) of the period last asked for."""


LimitKind = Literal["requests", "tokens", "concurrent", "budget"]
"""Which limit refused a request: RPM, TPM, concurrency or the token budget."""
