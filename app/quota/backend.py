"""The quota engine's interface: :class:`QuotaBackend`. The storages implement it below
(:mod:`app.quota.memory`, :mod:`app.quota.redis`); the factory that picks one is above, in
:mod:`app.quota`.

A backend implements five storage primitives (``_reserve``, ``_precheck``, ``_reconcile``,
``_renew``, ``_usage``); this module adds what every backend shares: argument checks, the errors
and their messages, the rate-limit headers, and one policy for every store failure: a storage
primitive raises :class:`QuotaBackendUnavailable` for any failure of its store (not only an
unreachable one), which is counted and logged (:mod:`app.quota.outage`) and then fails open or
closed as ``fail_open`` says; settling and renewing never raise it into a request.
"""

from __future__ import annotations

import logging
import math
import uuid
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Sequence
from typing import TypeVar

from app.quota.errors import QuotaBackendUnavailable, QuotaExceeded, QuotaTooLarge
from app.quota.headers import format_duration, rate_limit_headers, retry_headers
from app.quota.limits import Limits, QuotaUsage
from app.quota.outage import OutageLog
from app.quota.outcomes import (
    Admitted,
    Charge,
    Levels,
    Refused,
    Reservation,
    Subjects,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

RECONCILE_WINDOW_S = 86_400
"""How long a reservation can still be reconciled; later, only its concurrency slot is freed."""

CONCURRENCY_RETRY_S = 1.0
"""The suggested retry after a concurrency refusal: no one knows when a request will finish."""

PRECHECK_TOKENS = 1
"""What :meth:`QuotaBackend.precheck` assumes a request costs: every request has a prompt."""


class QuotaBackend(ABC):
    """Atomic admission against per-subject limits, interchangeable over storages.

    A request is checked against every limit of every subject (a tenant, then optionally its
    key) and either all are charged or none. Concurrency slots are leases of
    ``lease_seconds``: a holder that disappears loses its slot when the lease runs out, and a
    live one keeps it with :meth:`renew`.

    When the store fails, ``fail_open`` admits requests unchecked (flagged on the
    reservation) instead of raising :class:`QuotaBackendUnavailable`; either way the failure
    is counted (``lora_gateway_quota_backend_errors``) and logged.
    """

    def __init__(self, *, fail_open: bool = False, lease_seconds: float = 60.0) -> None:
        if not lease_seconds > 0:
            raise ValueError("lease_seconds must be positive")
        self.fail_open = fail_open
        self.lease_seconds = lease_seconds
        self._outage = OutageLog(fail_open=fail_open)

    async def precheck(self, subjects: Subjects) -> None:
        """Refuse early, before the request's size is known, what :meth:`reserve` would
        certainly refuse: a requests-per-minute limit or a concurrency limit already reached,
        or a tokens-per-minute limit or budget without room for a single token.

        Raises the :class:`QuotaExceeded` (headers, ``Retry-After``) that :meth:`reserve`
        would; commits nothing, so passing it admits nothing: :meth:`reserve` follows. A failed
        store fails open (passes) or closed (:class:`QuotaBackendUnavailable`), as reserve does.
        """
        pairs = tuple(subjects)
        _check_request(pairs, 0)
        if not pairs:
            return
        try:
            refused = await self._guard("precheck", self._precheck(pairs))
        except QuotaBackendUnavailable:
            if not self.fail_open:
                raise
            return
        if refused is not None:
            raise _exceeded(pairs, None, refused)

    async def reserve(
        self, subjects: Subjects, tokens: int, reservation_id: str | None = None
    ) -> Reservation:
        """Admit a request costing one request and ``tokens`` (prompt + max_tokens), or refuse it.

        Raises :class:`QuotaExceeded` (429) when a limit is reached, :class:`QuotaTooLarge` (400)
        when ``tokens`` alone exceed a subject's tokens per minute or budget,
        :class:`QuotaBackendUnavailable` (503) when the store fails and the backend fails
        closed, and ``ValueError`` for a duplicate subject or reservation id. On any error
        nothing was charged (a store that failed may have applied it all, or nothing; the
        leases then expire).
        """
        pairs = tuple(subjects)
        rid = reservation_id if reservation_id is not None else uuid.uuid4().hex
        _check_request(pairs, tokens)
        if not pairs:
            return Reservation(rid, (), tokens, 0)
        try:
            outcome = await self._guard("reserve", self._reserve(rid, tokens, pairs))
        except QuotaBackendUnavailable:
            if not self.fail_open:
                raise
            logger.debug("quota store failed: admitting %s unchecked", rid)
            return Reservation(rid, (), tokens, 0, unchecked=True)
        if isinstance(outcome, Refused):
            raise _exceeded(pairs, tokens, outcome)
        charges = tuple(
            Charge(subject, limits, period)
            for (subject, limits), period in zip(pairs, outcome.periods, strict=True)
        )
        headers = _headers(pairs, outcome.levels)
        return Reservation(rid, charges, tokens, outcome.at_us, headers)

    async def reconcile(self, reservation: Reservation, actual_tokens: int) -> None:
        """Settle a finished (or abandoned) request: free its concurrency slots and charge
        ``actual_tokens`` instead of the reserved tokens to tokens per minute and the budget.

        Idempotent: only the first call settles. A refund is not given to a tokens-per-minute
        limit that has emptied since the reservation (the charge has already drained away).
        Never raises for a failed store (it is counted and logged; the leases then expire and
        the reserved tokens stay charged).
        """
        if actual_tokens < 0:
            raise ValueError("actual_tokens must not be negative")
        if reservation.unchecked or not reservation.charges:
            return
        try:
            await self._guard("reconcile", self._reconcile(reservation, actual_tokens))
        except QuotaBackendUnavailable:
            return

    async def renew(self, reservation: Reservation) -> bool:
        """Extend this reservation's own concurrency leases by ``lease_seconds`` from now.

        Returns whether every lease was still held; an expired or released lease is not
        revived. ``False`` also means the store failed: that is counted and logged, never
        raised, so a caller renewing periodically just tries again next period.
        """
        if reservation.unchecked or not reservation.charges:
            return True
        try:
            return await self._guard("renew", self._renew(reservation))
        except QuotaBackendUnavailable:
            return False

    async def usage(self, subject: str, limits: Limits) -> QuotaUsage:
        """``subject``'s current consumption measured against ``limits`` (read-only)."""
        return await self._guard("usage", self._usage(subject, limits))

    @abstractmethod
    async def close(self) -> None:
        """Release the backend's connections."""

    # -- storage primitives ----------------------------------------------------------------------

    @abstractmethod
    async def _reserve(self, rid: str, tokens: int, subjects: Subjects) -> Admitted | Refused:
        """Check every limit of every subject and, only if all pass, charge them all, as one
        atomic step. ``ValueError`` if ``rid`` is already in use."""

    @abstractmethod
    async def _precheck(self, subjects: Subjects) -> Refused | None:
        """Check every limit of every subject as :meth:`_reserve` would for a request of
        ``PRECHECK_TOKENS``; change nothing. ``None`` when all pass."""

    @abstractmethod
    async def _reconcile(self, reservation: Reservation, actual_tokens: int) -> None:
        """Release the leases; the first time only, move the charges to ``actual_tokens``."""

    @abstractmethod
    async def _renew(self, reservation: Reservation) -> bool:
        """Extend the reservation's live leases; whether all were live."""

    @abstractmethod
    async def _usage(self, subject: str, limits: Limits) -> QuotaUsage:
        """Read a subject's consumption."""

    async def _guard(self, operation: str, call: Awaitable[T]) -> T:
        try:
            result = await call
        except QuotaBackendUnavailable as exc:
            self._outage.failed(operation, exc.reason, exc.__cause__)
            raise
        self._outage.succeeded()
        return result


def _check_request(subjects: tuple[tuple[str, Limits], ...], tokens: int) -> None:
    if tokens < 0:
        raise ValueError("tokens must not be negative")
    names = [subject for subject, _ in subjects]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate subject in {names}")
    for subject, limits in subjects:
        tpm = limits.tokens_per_minute
        if tpm is not None and tokens > tpm:
            raise QuotaTooLarge(
                f"Request too large for {subject} on tokens per minute (TPM): Limit {tpm}, "
                f"Requested {tokens}. Reduce the prompt or max_tokens.",
                limit="tokens",
                subject=subject,
            )
        budget = limits.token_budget
        if budget is not None and tokens > budget:
            raise QuotaTooLarge(
                f"Request too large for {subject}'s token budget: Limit {budget} per "
                f"{limits.budget_period}, Requested {tokens}. Reduce the prompt or max_tokens.",
                limit="budget",
                subject=subject,
            )


def _headers(subjects: Subjects, levels: Sequence[Levels]) -> dict[str, str]:
    requests: list[tuple[int, float]] = []
    tokens: list[tuple[int, float]] = []
    for (_, limits), level in zip(subjects, levels, strict=True):
        if limits.requests_per_minute is not None and level.requests is not None:
            requests.append((limits.requests_per_minute, level.requests))
        if limits.tokens_per_minute is not None and level.tokens is not None:
            tokens.append((limits.tokens_per_minute, level.tokens))
    return rate_limit_headers(requests, tokens)


def _exceeded(subjects: Subjects, tokens: int | None, refused: Refused) -> QuotaExceeded:
    """The refusal to report; ``tokens`` is ``None`` when the request's size is not known."""
    headers = _headers(subjects, refused.levels)
    requested = "" if tokens is None else f", Requested {tokens}"
    spent = [v for v in refused.violations if v.limit == "budget"]
    if spent:
        v = spent[0]
        subject, limits = subjects[v.index]
        return QuotaExceeded(
            f"You exceeded the token budget of {subject}: Limit {limits.token_budget} per "
            f"{limits.budget_period} (UTC), Used {v.used:.0f}{requested}. "
            f"It renews at the start of the next {limits.budget_period}.",
            limit="budget",
            subject=subject,
            retry_after=None,
            headers={**headers, "x-should-retry": "false"},
        )
    # All limits must pass at once, so the wait is the longest; it is also the one to report.
    v = max(refused.violations, key=lambda v: CONCURRENCY_RETRY_S if v.wait is None else v.wait)
    wait = CONCURRENCY_RETRY_S if v.wait is None else v.wait
    subject, limits = subjects[v.index]
    if v.limit == "concurrent":
        message = (
            f"Too many concurrent requests for {subject}: Limit {limits.max_concurrent}, "
            f"In flight {v.used:.0f}. Please try again when a request has finished."
        )
    else:
        name = "requests per min (RPM)" if v.limit == "requests" else "tokens per min (TPM)"
        limit = limits.requests_per_minute if v.limit == "requests" else limits.tokens_per_minute
        if v.limit == "requests":
            requested = ", Requested 1"
        message = (
            f"Rate limit reached for {subject} on {name}: Limit {limit}, "
            f"Used {math.ceil(v.used - 1e-6)}{requested}. "
            f"Please try again in {format_duration(wait)}."
        )
    return QuotaExceeded(
        message,
        limit=v.limit,
        subject=subject,
        retry_after=wait,
        headers={**headers, **retry_headers(wait)},
    )
