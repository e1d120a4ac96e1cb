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

from app import metrics
from app.quota import QuotaBackend, QuotaExceeded, QuotaTooLarge, Reservation
from app.serving.inflight import InFlight
from app.tenancy.models import ApiKey
from app.usage import UsageLedger, UsageRecord

if TYPE_CHECKING:
    from app.serving.generation import Generation


@dataclass
class Progress:
    """Completion tokens generated so far, per choice (outputs are deltas), and
    the token timing metrics as they come."""

    tenant: str
    model: str
    started: float = field(default_factory=time.monotonic)
    tokens: dict[int, int] = field(default_factory=dict)
    last_token_at: float | None = None

    def observe(self, output: RequestOutput) -> None:
        new = 0
        for choice in output.outputs:
            self.tokens[choice.index] = self.tokens.get(choice.index, 0) + len(choice.token_ids)
            new += len(choice.token_ids)
        if not new:
            return
        now = time.monotonic()
        if self.last_token_at is None:
            metrics.TIME_TO_FIRST_TOKEN.labels(self.tenant, self.model).observe(now - self.started)
            stats = output.metrics
            if stats is not None and stats.scheduled_ts >= stats.queued_ts > 0:
                # Both on the engine core's clock.
                wait = stats.scheduled_ts - stats.queued_ts
                metrics.QUEUE_WAIT.labels(self.tenant, self.model).observe(wait)
            new -= 1
        else:
            gap = (now - self.last_token_at) / new
            latency = metrics.INTER_TOKEN_LATENCY.labels(self.tenant, self.model)
            for _ in range(new):
                latency.observe(gap)
        self.last_token_at = now

    @property
    def completion_tokens(self) -> int:
        return sum(self.tokens.values())


@dataclass
class Admission:
    """A request's quota reservation, settled exactly once however the request ends."""

    reservation: Reservation
    settled: bool = False


def key_subject(key: ApiKey) -> str:
    """The quota subject of a key's own limits; a tenant's is its id."""
    return f"{key.tenant_id}/{key.id}"


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
        # lora_id -> when a request last started with that adapter version
        self.last_used: dict[int, datetime] = {}

    async def admit(self, generation: Generation) -> Generation:
        """Reserve the request's worst case (prompt plus every choice's max_tokens)
        against the tenant's limits, or raise the quota error; nothing is
        consumed by a refusal."""
        principal = generation.principal
        tenant, key = principal.tenant, principal.key
        subjects = [
            (subject, limits)
            for subject, limits in ((tenant.id, tenant.limits), (key_subject(key), key.limits))
            if not limits.unlimited
        ]
        if not subjects:
            return generation
        worst_case = generation.prompt_tokens + (generation.params.max_tokens or 0) * (
            generation.params.n
        )
        try:
            reservation = await self._quota.reserve(subjects, worst_case, generation.request_id)
        except (QuotaExceeded, QuotaTooLarge) as exc:
            limit = "too_large" if isinstance(exc, QuotaTooLarge) else exc.limit
            scope = "tenant" if exc.subject == tenant.id else "key"
            metrics.QUOTA_REJECTIONS.labels(tenant.id, limit, scope).inc()
            raise
        if reservation.unchecked:
            metrics.QUOTA_UNCHECKED.labels(tenant.id).inc()
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
        tenant, model = generation.principal.tenant.id, generation.target.model
        progress = Progress(tenant, model)
        started_at, started = datetime.now(timezone.utc), progress.started
        if generation.target.adapter is not None:
            self.last_used[generation.target.adapter.lora_id] = started_at
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
                elapsed = time.monotonic() - started
                metrics.REQUESTS.labels(tenant, model, generation.endpoint, status).inc()
                metrics.PROMPT_TOKENS.labels(tenant, model).inc(generation.prompt_tokens)
                metrics.COMPLETION_TOKENS.labels(tenant, model).inc(progress.completion_tokens)
                metrics.REQUEST_DURATION.labels(tenant, model, generation.endpoint).observe(elapsed)
                adapter = generation.target.adapter
                self._ledger.record(
                    UsageRecord(
                        request_id=generation.request_id,
                        tenant_id=tenant,
                        key_id=generation.principal.key_id,
                        endpoint=generation.endpoint,
                        model=model,
                        adapter=adapter.name if adapter else None,
                        adapter_version=adapter.version if adapter else None,
                        prompt_tokens=generation.prompt_tokens,
                        completion_tokens=progress.completion_tokens,
                        status=status,
                        latency_ms=round(elapsed * 1000),
                        started_at=started_at,
                        finished_at=datetime.now(timezone.utc),
                    )
                )
