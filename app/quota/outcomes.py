"""What a quota reservation is, and what the storages report to the backend interface."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from app.quota.limits import LimitKind, Limits


@dataclass(frozen=True)
class Charge:
    """One subject's part of a reservation: its limits at reservation time and the budget
    period (``2025-01-31`` / ``2025-01``) charged, ``None`` without a budget."""

    subject: str
    limits: Limits
    period: str | None


@dataclass(frozen=True)
class Reservation:
    """An admitted request's hold on its subjects' limits, until :meth:`QuotaBackend.reconcile`.

    ``tokens`` were charged to each subject's tokens per minute and budget, one request to each
    requests per minute, and a concurrency slot (a lease) taken where a subject has a limit.
    ``headers`` are the ``x-ratelimit-*`` headers for the response. ``unchecked`` is set when
    the store was unreachable and the backend fails open: nothing was checked or charged.
    """

    id: str
    charges: tuple[Charge, ...]
    tokens: int
    reserved_at_us: int
    headers: Mapping[str, str] = field(default_factory=dict, compare=False)
    unchecked: bool = False

    @property
    def subjects(self) -> tuple[str, ...]:
        return tuple(charge.subject for charge in self.charges)

    @property
    def leased(self) -> bool:
        """Whether it holds a concurrency lease (one of its subjects limits requests in
        flight), which lapses unless renewed."""
        return not self.unchecked and any(
            charge.limits.max_concurrent is not None for charge in self.charges
        )


@dataclass(frozen=True)
class Levels:
    """A subject's requests- and tokens-per-minute levels (``None``: limit unset)."""

    requests: float | None
    tokens: float | None


@dataclass(frozen=True)
class Violation:
    """Subject ``index`` would exceed ``limit``; ``wait`` seconds until it would not (``None``:
    unknown), ``used`` is that limit's level, live leases, or budget spent."""

    index: int
    limit: LimitKind
    wait: float | None
    used: float


@dataclass(frozen=True)
class Admitted:
    """Every limit passed and all were charged at ``at_us``; levels are after the charge."""

    at_us: int
    periods: tuple[str | None, ...]
    levels: tuple[Levels, ...]


@dataclass(frozen=True)
class Refused:
    """Some limits failed; nothing was charged. Levels are as found."""

    violations: tuple[Violation, ...]
    levels: tuple[Levels, ...]


Subjects = Sequence[tuple[str, Limits]]
