"""What happens around every engine request: quota admission and settlement,
in-flight accounting (so adapter removal can wait), token counting as the
engine streams, and the usage record."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

from vllm import RequestOutput

from app.quota import QuotaBackend, Reservation
from app.serving.inflight import InFlight
from app.usage import UsageLedger, UsageRecord

if TYPE_CHECKING:
    from app.serving.generation import Generation


@dataclass
class Progress:
    """Completion tokens generated so far, per choice (outputs are deltas)."""

    tokens: dict[int, int] = field(default_factory=dict)

    def observe(self, output: RequestOutput) -> None:
        for choice in output.outputs:
            self.tokens[choice.index] = self.tokens.get(choice.index, 0) + len(choice.token_ids)

    @property
    def completion_tokens(self) -> int:
        return sum(self.tokens.values())


@dataclass
class Admission:
    """A request's quota reservation, settled exactly once however the request ends."""

    reservation: Reservation
    settled: bool = False


Spawn = Callable[[Coroutine[Any, Any, None]], None]


class RequestTracker:
    def __init__(
        self,
        in_flight: InFlight,
        ledger: UsageLedger,
        quota: QuotaBackend,
        spawn: Spawn,
        *,
        lease_seconds: float,
    ) -> None:
        self.in_flight = in_flight
        self._ledger = ledger
        self._quota = quota
        self._spawn = spawn
        self._renew_every = lease_seconds / 3

    async def admit(self, generation: Generation) -> Generation:
        """Reserve the request's worst case (prompt plus every choice's max_tokens)
        against the tenant's limits, or raise the quota error; nothing is
        consumed by a refusal."""
        limits = generation.principal.tenant.limits
        if limits.unlimited:
            return generation
        worst_case = generation.prompt_tokens + (generation.params.max_tokens or 0) * (
            generation.params.n
        )
        reservation = await self._quota.reserve(
            [(generation.principal.tenant.id, limits)], worst_case, generation.request_id
        )
        return replace(generation, admission=Admission(reservation))

    def settle(self, generation: Generation, completion_tokens: int) -> None:
        """Charge what was generated, refund the rest, free the slot (once)."""
        admission = generation.admission
        if admission is None or admission.settled:
            return
        admission.settled = True
        actual = generation.prompt_tokens + completion_tokens
        self._spawn(self._quota.reconcile(admission.reservation, actual))

    async def _keep_lease(self, admission: Admission) -> None:
        while True:
            await asyncio.sleep(self._renew_every)
            await self._quota.renew(admission.reservation)

    @contextmanager
    def track(self, generation: Generation) -> Iterator[Progress]:
        """Wrap one engine request; what it generated is recorded however it ends."""
        progress = Progress()
        started_at, started = datetime.now(timezone.utc), time.monotonic()
        status: Literal["ok", "cancelled", "error"] = "error"
        lease = (
            asyncio.ensure_future(self._keep_lease(generation.admission))
            if generation.admission is not None
            else None
        )
        with self.in_flight.hold(generation.target.adapter):
            try:
                yield progress
                status = "ok"
            except (asyncio.CancelledError, GeneratorExit):
                status = "cancelled"
                raise
            finally:
                if lease is not None:
                    lease.cancel()
                self.settle(generation, progress.completion_tokens)
                adapter = generation.target.adapter
                self._ledger.record(
                    UsageRecord(
                        request_id=generation.request_id,
                        tenant_id=generation.principal.tenant.id,
                        key_id=generation.principal.key_id,
                        endpoint=generation.endpoint,
                        model=generation.target.model,
                        adapter=adapter.name if adapter else None,
                        adapter_version=adapter.version if adapter else None,
                        prompt_tokens=generation.prompt_tokens,
                        completion_tokens=progress.completion_tokens,
                        status=status,
                        latency_ms=round((time.monotonic() - started) * 1000),
                        started_at=started_at,
                        finished_at=datetime.now(timezone.utc),
                    )
                )
