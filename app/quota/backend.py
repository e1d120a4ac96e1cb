"""The quota engine's interface: :class:`QuotaBackend`. The storages implement it below
(:mod:`app.quota.memory`, :mod:`app.quota.redis`); the factory that picks one is above, in
:mod:`app.quota`.

A backend implements the storage primitives (``_reserve``, ``_void``, ``_precheck``,
``_reconcile``, ``_renew``, ``_charge_refused``, ``_usage``, ``_close``); this module adds what
every backend shares: argument checks, the errors and their messages, the rate-limit headers,
voiding a reservation whose reply was lost, and one policy for every store failure: a storage
primitive raises :class:`QuotaBackendUnavailable` for any failure of its store (not only an
unreachable one), which is counted and logged (:mod:`app.quota.outage`) and then fails open or
closed as ``fail_open`` says; settling, renewing, voiding and charging a refusal never raise it
into a request.
"""

from __future__ import annotations

import asyncio
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Sequence
from typing import ClassVar, TypeVar

from app.ids import random_hex
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

VOID_TIMEOUT_S = 10.0
"""How long voiding a reservation whose reply was lost may take. Longer than a store's socket
timeout on purpose: the store that was too slow for the reservation must not also be too slow
for its undoing. Past it, the leases expire and the tokens stay charged."""

VOID_MEMORY_S = 600
"""How long a voided reservation id is remembered, so that a reserve still in transit when it
was voided cannot charge when it lands: far longer than a command stays in transit."""


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

    settles_in_place: ClassVar[bool] = False
    """Whether :meth:`reconcile` never waits (the state is in this process): a caller that
    would settle in a task of its own, not to wait for a store, may settle in place."""

    def __init__(self, *, fail_open: bool = False, lease_seconds: float = 60.0) -> None:
        if not lease_seconds > 0:
            raise ValueError("lease_seconds must be positive")
        self.fail_open = fail_open
        self.lease_seconds = lease_seconds
        self._outage = OutageLog(fail_open=fail_open)
        # Voids in flight; held here because the event loop keeps only weak references to tasks.
        self._voiding: set[asyncio.Task[None]] = set()

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
        closed, and ``ValueError`` for a duplicate subject or reservation id. On any error, and
        when the call is cancelled, nothing stays charged: a reservation the store may have
        applied with its reply lost is voided in the background (:meth:`_void_later`; should
        the store stay out of reach for ``VOID_TIMEOUT_S``, its leases expire and its tokens
        stay charged).
        """
        pairs = tuple(subjects)
        rid = reservation_id if reservation_id is not None else random_hex()
        _check_request(pairs, tokens)
        if not pairs:
            return Reservation(rid, (), tokens, 0)
        # Tells this call's reservation from any other under the same id, so that voiding it
        # can never undo another's.
        attempt = random_hex()
        try:
            outcome = await self._guard("reserve", self._reserve(rid, attempt, tokens, pairs))
        except asyncio.CancelledError:
            self._void_later(rid, attempt, tokens, pairs)
            raise
        except QuotaBackendUnavailable:
            self._void_later(rid, attempt, tokens, pairs)
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

    async def charge_refused(self, subjects: Subjects) -> None:
        """Count a request refused after it was read (a 400: it did not parse, or did not
        tokenise, or does not fit) as one request against each subject's requests per minute:
        reading it cost the gateway as much as an admission does. No tokens, no concurrency
        slot, no budget. A limit already reached stays reached but is not pushed past: the
        refusal never makes a later request wait longer than a full bucket does.

        ``ValueError`` for a duplicate subject, as :meth:`precheck`. Never raises for a failed
        store (it is counted and logged; the request then costs nothing).
        """
        pairs = tuple(subjects)
        _check_request(pairs, 0)
        counted = tuple(pair for pair in pairs if pair[1].requests_per_minute is not None)
        if not counted:
            return
        try:
            await self._guard("charge_refused", self._charge_refused(counted))
        except QuotaBackendUnavailable:
            return

    async def usage(self, subject: str, limits: Limits) -> QuotaUsage:
        """``subject``'s current consumption measured against ``limits`` (read-only)."""
        return await self._guard("usage", self._usage(subject, limits))

    async def drain(self) -> None:
        """Wait until the voids in flight have finished (each within ``VOID_TIMEOUT_S``)."""
        while self._voiding:
            await asyncio.gather(*self._voiding, return_exceptions=True)

    async def close(self) -> None:
        """Finish the voids in flight, then release the backend's connections."""
        await self.drain()
        await self._close()

    # -- voiding a reservation whose reply was lost ----------------------------------------------

    def _void_later(self, rid: str, attempt: str, tokens: int, subjects: Subjects) -> None:
        """Undo, in the background, what reserve attempt ``attempt`` charged, if it did.

        A reservation's reply can be lost after the store applied it: the caller was cancelled
        (its client left) while the reply was in flight, or the reply came after the socket
        timeout (a 503). Nobody holds that reservation, so nobody would settle it, and the
        worst case would stay charged for the whole period. The undo runs on its own task: a
        cancelled caller cannot cancel it, and a 503 is not delayed by it.
        """
        task = asyncio.get_running_loop().create_task(
            self._void_bounded(rid, attempt, tokens, subjects)
        )
        self._voiding.add(task)
        task.add_done_callback(self._voiding.discard)

    async def _void_bounded(self, rid: str, attempt: str, tokens: int, subjects: Subjects) -> None:
        """``_void`` within ``VOID_TIMEOUT_S``; a failure is counted and logged (the leases
        then expire and the tokens stay charged). Not through :meth:`_guard`: a void that
        succeeds, waiting longer than a request does, does not mean the store is back."""
        try:
            async with asyncio.timeout(VOID_TIMEOUT_S):
                undone = await self._void(rid, attempt, tokens, subjects)
        except QuotaBackendUnavailable as exc:
            self._outage.failed("void", exc.reason, exc.__cause__)
        except TimeoutError as exc:
            self._outage.failed("void", "timeout", exc)
        else:
            if undone:
                logger.debug("reservation %s voided: its reply was lost", rid)

    # -- storage primitives ----------------------------------------------------------------------

    @abstractmethod
    async def _reserve(
        self, rid: str, attempt: str, tokens: int, subjects: Subjects
    ) -> Admitted | Refused:
        """Check every limit of every subject and, only if all pass, charge them all, as one
        atomic step, recording the reservation under ``rid`` and ``attempt`` (for
        :meth:`_void`). ``ValueError`` if ``rid`` is in use or was voided."""

    @abstractmethod
    async def _void(self, rid: str, attempt: str, tokens: int, subjects: Subjects) -> bool:
        """Undo reserve attempt ``attempt`` of ``rid`` if it charged (all of it: the request
        counted, the tokens, the leases, the budget), and keep ``rid`` from being reserved for
        ``VOID_MEMORY_S``, so that an attempt still in transit charges nothing when it lands.
        Idempotent; leaves another attempt's reservation alone. Whether it undid a charge."""

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
    async def _charge_refused(self, subjects: Subjects) -> None:
        """Add one request to each subject's requests bucket (every subject has a limit),
        up to the limit."""

    @abstractmethod
    async def _usage(self, subject: str, limits: Limits) -> QuotaUsage:
        """Read a subject's consumption."""

    @abstractmethod
    async def _close(self) -> None:
        """Release the backend's connections."""

    async def _guard(self, operation: str, call: Awaitable[T]) -> T:
        try:
            result = await call
        except QuotaBackendUnavailable as exc:
            self._outage.failed(operation, exc.reason, exc.__cause__)
            raise
        self._outage.succeeded()
        return result


def shown(subject: str) -> str:
    """A subject as a refusal names it: a tenant's subject carries its incarnation after "@"
    (:attr:`app.tenancy.tenants.Tenant.quota_subject`), which is ours, not the tenant's."""
    return subject.partition("@")[0]


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
                f"Request too large for {shown(subject)} on tokens per minute (TPM): Limit {tpm}, "
                f"Requested {tokens}. Reduce the prompt or max_tokens.",
                limit="tokens",
                subject=subject,
            )
        budget = limits.token_budget
        if budget is not None and tokens > budget:
            raise QuotaTooLarge(
                f"Request too large for {shown(subject)}'s token budget: Limit {budget} per "
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
            f"You exceeded the token budget of {shown(subject)}: Limit {limits.token_budget} per "
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
            f"Too many concurrent requests for {shown(subject)}: Limit {limits.max_concurrent}, "
            f"In flight {v.used:.0f}. Please try again when a request has finished."
        )
    else:
        name = "requests per min (RPM)" if v.limit == "requests" else "tokens per min (TPM)"
        limit = limits.requests_per_minute if v.limit == "requests" else limits.tokens_per_minute
        if v.limit == "requests":
            requested = ", Requested 1"
        message = (
            f"Rate limit reached for {shown(subject)} on {name}: Limit {limit}, "
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
