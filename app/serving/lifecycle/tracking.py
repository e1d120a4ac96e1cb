"""One owner for each completion request's lifecycle.

:meth:`RequestTracker.track` is the whole of it, as one ``async with``: resolve the request's
``model`` for its tenant, check the request-rate limits that need no token count, tokenise off
the event loop, reserve the worst case against the quotas, wait for an engine slot
(:mod:`app.scheduling`), then hand the caller a :class:`Run` whose answer it may read. However
the block ends (it finished, the client left, an error, a shutdown), the exit closes the run
(an unfinished request is aborted and what it produced up to then is counted), settles the
reservation exactly once with that count, counts the outcome and writes the usage record, and
only then gives the engine slot back. The JSON and the SSE response both run inside it.

What a request runs on is its service's choice (:meth:`Service.start`): the in-process engine
(``EngineRun``, :mod:`app.serving.in_process.engine_run`) or, in the front role, an upstream
OpenAI server (``UpstreamRun``, :mod:`app.serving.front.upstream_run`). The tracker only needs
a :class:`Run`'s headers, outcome and token counts, and its :meth:`Run.close`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import AbstractContextManager, ExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from app import metrics, tracing
from app.access_log import AccessRecord
from app.errors import AdapterUnservableError, GatewayError
from app.ids import random_hex
from app.inside_vllm.objectives import Objectives
from app.overhead import RequestOverhead
from app.protocol import SamplingFields
from app.quota import Limits, QuotaBackend, QuotaExceeded, QuotaTooLarge, Reservation
from app.scheduling import Admission, AdmissionRefused, FcfsAdmission, Slot, Ticket
from app.serving.lifecycle.fair_worker import FairWorker
from app.serving.lifecycle.inflight import InFlight
from app.serving.lifecycle.objectives import (
    ClassObjectives,
    carry,
    carry_headroom,
    spend_wait,
)
from app.serving.lifecycle.objectives import outcome as slo_outcome
from app.serving.lifecycle.runs import (
    ClientDisconnected,
    Outcome,
    Request,
    Run,
    RunT,
    Service,
)
from app.serving.preparation.generation import Generation
from app.serving.preparation.structured import wants_constraint
from app.tenancy.adapters import Adapter
from app.tenancy.grants import Pin
from app.tenancy.registry import TenantRegistry
from app.tenancy.tenants import ApiKey, ModelTarget, Principal, Tenant
from app.usage import UsageLedger, UsageRecord

logger = logging.getLogger(__name__)

T = TypeVar("T")
Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]


# Every settlement's metrics, their children looked up once.
_REQUESTS = metrics.Children(metrics.REQUESTS)
_PROMPT_TOKENS = metrics.Children(metrics.PROMPT_TOKENS)
_COMPLETION_TOKENS = metrics.Children(metrics.COMPLETION_TOKENS)
_REQUEST_DURATION = metrics.Children(metrics.REQUEST_DURATION)

SHADOW_OUTCOMES: dict[Outcome, str] = {"ok": "ok", "error": "error", "cancelled": "preempted"}

INLINE_PREPARE_BYTES = 2048
"""A request body up to this size is tokenised on the event loop when the tokenizer thread is
idle: handing it to the thread and back costs more CPU than tokenising it. One with an output
constraint never is: what it asks the constraint checks to read is not bounded by its size."""


@dataclass
class BatchLine:
    """A request that is a line of a batch: its usage record is put in ``records`` (the
    batch commits it with the line's output, in one transaction), not in the ledger's
    queue."""

    batch_id: str
    records: list[UsageRecord] = field(default_factory=list)
    ending: Sequence[str] = ()
    """The batch's ending, once it ends (the runner's list, set before it aborts the lines in
    flight). A line cancelled while it is empty was cut off (its replica stops, or lost the
    batch): it is not billed, runs again, and so charges its token budget nothing."""
    attempt: str = field(default_factory=random_hex)
    """This attempt's own: a line's request id is the same at every attempt, and a reservation
    an attempt cut off by a kill left open must not stand in the way of the next."""

    def reservation_id(self, request_id: str) -> str:
        return f"{request_id}.{self.attempt}"

    def cut_off(self, outcome: str) -> bool:
        """Whether a line that ended with ``outcome`` was cut off, not ended by its batch."""
        return outcome == "cancelled" and not self.ending


def ticket_of(generation: Generation) -> Ticket:
    """What the scheduler weighs a request by: its tenant, worst-case tokens, adapter,
    output constraint."""
    tenant, params, adapter = (
        generation.principal.tenant,
        generation.params,
        generation.target.adapter,
    )
    return Ticket(
        request_id=generation.request_id,
        tenant=tenant.id,
        weight=tenant.weight,
        cost=generation.worst_case_tokens,
        adapter=adapter.lora_id if adapter is not None else None,
        seqs=params.n,
        interactive=tenant.priority == "interactive",
        constrained=params.structured_outputs is not None,
    )


def sticky_key(request: SamplingFields, principal: Principal) -> str:
    """Who a sticky split keeps on one version: the request's end user (OpenAI's ``user``),
    else its API key."""
    return f"user:{request.user}" if request.user else f"key:{principal.key_id}"


def key_subject(key: ApiKey) -> str:
    """The quota subject of a key's own limits; a tenant's is :attr:`Tenant.quota_subject`."""
    return f"{key.tenant_id}/{key.id}"


def quota_subjects(principal: Principal) -> list[tuple[str, Limits]]:
    """The subjects a request is charged to: its tenant, and its key where it has limits."""
    tenant, key = principal.tenant, principal.key
    return [
        (subject, limits)
        for subject, limits in (
            (tenant.quota_subject, tenant.limits),
            (key_subject(key), key.limits),
        )
        if not limits.unlimited
    ]


def _exit_once_entered(copy: AbstractContextManager[Path], entering: asyncio.Future[Path]) -> None:
    if not entering.cancelled() and entering.exception() is None:
        copy.__exit__(None, None, None)


class LeaseRenewal:
    """Renews ``reservation``'s lease every ``every`` seconds until :meth:`stop`. A timer
    between renewals, not a task per request: most requests end before their first."""

    def __init__(self, quota: QuotaBackend, reservation: Reservation, every: float) -> None:
        self._quota = quota
        self._reservation = reservation
        self._every = every
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(every, self._due)
        self._renewing: asyncio.Task[None] | None = None

    def _due(self) -> None:
        self._timer = None
        self._renewing = self._loop.create_task(self._renew())

    async def _renew(self) -> None:
        try:
            await self._quota.renew(self._reservation)
        except Exception:
            logger.warning("could not renew lease %s", self._reservation.id, exc_info=True)
        self._renewing = None
        self._timer = self._loop.call_later(self._every, self._due)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._renewing is not None:
            self._renewing.cancel()
            self._renewing = None


class RequestTracker:
    def __init__(
        self,
        registry: Callable[[], TenantRegistry],
        in_flight: InFlight,
        ledger: UsageLedger,
        quota: QuotaBackend,
        spawn: Spawn,
        *,
        lease_seconds: float,
        held_copy: Callable[[str], AbstractContextManager[Path]] | None,
        held_copy_waits: bool = True,
        admission: Admission | None = None,
        shadow_wait_seconds: float = 30.0,
        on_unservable: Callable[[Adapter, str], Coroutine[Any, Any, None]] | None = None,
        objectives: ClassObjectives | None = None,
        role: str = "all",
    ) -> None:
        """``held_copy`` gives this host's copy of an adapter's content (by digest) for an
        engine in this process to load, kept in place while the request runs; ``None`` where
        the engine is elsewhere (the front role), which names adapters by their global name
        and never needs their content. Where entering a copy may wait (a fetch, a lock:
        ``held_copy_waits``), it is entered in a thread, else on the event loop.
        ``admission`` decides when an admitted request may enter the engine (default: at once);
        a shadow request waits up to ``shadow_wait_seconds`` for capacity no request wants.
        An adapter version that fails to load in the engine is refused from then on, before
        the engine, and ``on_unservable`` is told once (the version and the engine's reason).
        Each request carries its latency ``objectives`` (its tenant's own, else its class's)
        to the engine's slot turns, and is counted by its outcome against them.
        ``role``: the deployment role its requests' overhead is observed under.
        """
        self._role = role
        self._on_unservable = on_unservable
        # lora_id -> why the engine could not load it
        self.unservable: dict[int, str] = {}
        self._objectives = objectives or ClassObjectives({}, {})
        self._shadow_wait = shadow_wait_seconds
        self._admission = admission or FcfsAdmission()
        self.in_flight = in_flight
        self._registry = registry
        self._held_copy = held_copy
        self._held_copy_waits = held_copy_waits
        self._ledger = ledger
        self._quota = quota
        self._spawn = spawn
        self._renew_every = lease_seconds / 3
        # One thread: Hugging Face tokenizers are not safe to share between threads.
        self._tokenizer = FairWorker("tokenizer")
        # Output constraints' compile checks, beside it: a long one holds no tokenising.
        self._compiler = FairWorker("grammar-check")
        # lora_id -> when a request last started with that adapter version
        self.last_used: dict[int, datetime] = {}

    def close(self) -> None:
        self._tokenizer.close()
        self._compiler.close()

    @asynccontextmanager
    async def track(
        self,
        service: Service[Request, RunT],
        request: Request,
        principal: Principal,
        request_id: str,
        *,
        body_bytes: int | None = None,
        prechecked: bool = False,
        pinned: Pin | None = None,
        batch: BatchLine | None = None,
        overhead: RequestOverhead | None = None,
        access: AccessRecord | None = None,
    ) -> AsyncIterator[RunT]:
        """Admit the request and yield its :class:`Run`; settle and record it on exit.
        ``body_bytes``, the size of the request's body where it is known, bounds the work of
        tokenising it; ``prechecked`` says :meth:`precheck` passed before it was read;
        ``pinned``, the adapter version it must run on (a Responses chain's or a batch's);
        ``batch``, the batch line it is, whose usage record goes to the line's own sink
        rather than the ledger's queue (the line commits it with its output); ``overhead``,
        where the request's time in the gateway's own code is counted (app/overhead.py):
        observed once it is settled; ``access``, its access line's record
        (app/access_log.py), given the alias, version, queue wait and what it used."""
        overhead = overhead or RequestOverhead(self._role)
        request_trace = tracing.of(overhead)
        # This host's copy of the request's adapter stays in place until the request ended.
        with ExitStack() as holds:
            generation, reservation = await self._admit(
                service,
                request,
                principal,
                request_id,
                holds,
                body_bytes,
                prechecked,
                pinned,
                overhead,
                reservation_id=batch.reservation_id(request_id) if batch else request_id,
            )
            overhead.begin("engine")
            run = service.start(request, generation, reservation)
            began = time.monotonic()
            adapter = generation.target.adapter
            if access is not None:
                access.model = generation.target.model
                access.version = adapter.version if adapter is not None else None
            started_at = datetime.now(timezone.utc)
            if adapter is not None:
                self.last_used[adapter.lora_id] = started_at
            lease = (
                LeaseRenewal(self._quota, reservation, self._renew_every)
                if reservation is not None and reservation.leased
                else None
            )
            ticket = ticket_of(generation)
            if batch is not None:
                # A batch's lines queue apart from their tenant's own requests, at the batch
                # class, and yield to interactive requests (docs/batches.md).
                ticket = replace(
                    ticket, tenant=f"{ticket.tenant}:batch", interactive=False, batch_line=True
                )
            slot = self._admission.admit(ticket)
            overhead.end("engine")
            refused: AdmissionRefused | None = None
            outcome: Outcome = "error"
            with self.in_flight.hold(adapter):
                try:
                    # Queued for an engine slot after the reservation, so the queue holds only
                    # requests the quotas allow, and before the run is read: a refusal is a status.
                    if request_trace is not None:
                        request_trace.begin(tracing.names.ADMISSION)
                    await slot.acquire()
                    waited = time.monotonic() - began
                    spend_wait(generation.params, waited)
                    if slot.through_headroom:
                        carry_headroom(generation.params)
                    if request_trace is not None:
                        run.trace_headers = request_trace.admitted(waited)
                    if access is not None:
                        access.queue_wait = waited
                    # The slot goes back as the engine ends the request, not after its
                    # answer has been written, settled and recorded.
                    run.when_ended(partial(self._give_back, run, slot))
                    # Until its first token it waits inside the engine (docs/scheduling.md).
                    run.when_first_token(slot.started)
                    yield run
                    outcome = run.outcome()
                except (asyncio.CancelledError, ClientDisconnected):
                    outcome = "cancelled"
                    raise
                except AdmissionRefused as exc:
                    refused = exc
                    raise
                except AdapterUnservableError as exc:
                    if adapter is not None:
                        self._unservable(adapter, exc.reason)
                    raise
                finally:
                    if lease is not None:
                        lease.stop()
                    if request_trace is not None and refused is None:
                        request_trace.expect_settlement()
                    # Shielded: a shutdown that cancels this request still settles and records it.
                    finish = (
                        self._finish(
                            run, outcome, began, started_at, request.user, overhead, batch, access
                        )
                        if refused is None
                        else self._refused(run, refused, access)
                    )
                    await asyncio.shield(self._spawn(self._released_after(finish, run, slot)))
                    candidate = generation.target.shadow
                    if candidate is not None and refused is None and outcome != "cancelled":
                        self._spawn(self._shadow(service, request, generation, candidate))

    async def _admit(
        self,
        service: Service[Request, Any],
        request: Request,
        principal: Principal,
        request_id: str,
        holds: ExitStack,
        body_bytes: int | None,
        prechecked: bool,
        pinned: Pin | None,
        overhead: RequestOverhead,
        *,
        reservation_id: str,
    ) -> tuple[Generation, Reservation | None]:
        """Resolve, pre-check, tokenise and reserve (as ``reservation_id``), or raise; a
        refusal holds nothing (what ``holds`` holds is the caller's to let go)."""
        tenant = principal.tenant
        model = metrics.UNKNOWN_MODEL  # until resolved: refused names stay out of the labels
        request_trace = tracing.of(overhead)
        try:
            overhead.begin("resolution")
            target = self._registry().resolve(
                tenant, request.model, sticky_key=sticky_key(request, principal), pinned=pinned
            )
            model = target.model
            if request_trace is not None:
                adapter = target.adapter
                request_trace.resolved(
                    adapter.engine_name if adapter is not None else model,
                    adapter.name if adapter is not None else None,
                    adapter.version if adapter is not None else None,
                    tenant.priority,
                )
            if target.adapter is not None and (reason := self.why_unservable(target.adapter)):
                raise AdapterUnservableError(model, reason)
            if target.adapter is not None and self._held_copy is not None:
                copy = self._held_copy(target.adapter.sha256)
                target = await self._on_this_host(target, target.adapter, holds, copy)
            subjects = quota_subjects(principal)
            if subjects and not prechecked:
                # The limits that need no token count, before the prompt is tokenised.
                await self._checked(self._quota.precheck(subjects), tenant)
            overhead.end("resolution")
            overhead.begin("preparation")
            generation = await self._prepare(
                service, request, principal, target, request_id, body_bytes
            )
            carry(generation.params, self._objectives.of(tenant))
            reservation = None
            if subjects:
                # The quota backend's round trip (Redis's, where it is shared).
                with tracing.step(request_trace, tracing.names.QUOTA, under="preparation"):
                    reservation = await self._checked(
                        self._quota.reserve(subjects, generation.worst_case_tokens, reservation_id),
                        tenant,
                    )
                if reservation.unchecked:
                    metrics.QUOTA_UNCHECKED.labels(tenant.id).inc()
            overhead.end("preparation")
        except GatewayError as exc:
            await self._counted_refusal(exc, principal, model, service.endpoint)
            raise
        return generation, reservation

    async def check(
        self,
        service: Service[Request, Any],
        request: Request,
        principal: Principal,
        request_id: str,
        *,
        pinned: Pin | None = None,
    ) -> ModelTarget:
        """Refuse ``request`` as admission would once its body is read (its model, the
        version it is pinned to and whether it can be served, its prompt against the
        context, its parameters and output constraint), without admitting it: a request run
        detached from its HTTP request (a background response) is refused so before it is
        accepted. Counted like any refusal. The target it resolved: of a split, the version
        drawn, for the request to run on."""
        model = metrics.UNKNOWN_MODEL
        try:
            target = self._registry().resolve(
                principal.tenant, request.model, sticky_key=sticky_key(request, principal),
                pinned=pinned,
            )  # fmt: skip
            model = target.model
            if target.adapter is not None and (reason := self.why_unservable(target.adapter)):
                raise AdapterUnservableError(model, reason)
            await self._prepare(service, request, principal, target, request_id, None)
        except GatewayError as exc:
            await self._counted_refusal(exc, principal, model, service.endpoint)
            raise
        return target

    async def _counted_refusal(
        self, exc: GatewayError, principal: Principal, model: str, endpoint: str
    ) -> None:
        metrics.REQUESTS.labels(
            principal.tenant.id, model, endpoint, exc.code or exc.error_type
        ).inc()
        if exc.status_code in (400, 404):  # refused once parsed or tokenised
            await self.charge_refused(principal)

    async def precheck(self, principal: Principal, endpoint: str) -> None:
        """Refuse, before the request's body is read, a request its rate or concurrency
        limits would refuse whatever its body (429): a tenant at its limit cannot make the
        gateway read and parse bodies it will refuse anyway. Counted like any refusal."""
        subjects = quota_subjects(principal)
        if not subjects:
            return
        tenant = principal.tenant.id
        try:
            await self._checked(self._quota.precheck(subjects), principal.tenant)
        except GatewayError as exc:
            status = exc.code or exc.error_type
            metrics.REQUESTS.labels(tenant, metrics.UNKNOWN_MODEL, endpoint, status).inc()
            raise

    async def charge_refused(self, principal: Principal) -> None:
        """Count a request refused after its body was parsed or its prompt tokenised (a 400,
        or a 404 for a model not its tenant's) as one request against its requests-per-minute
        limits, with no tokens: that work is not free, so a tenant cannot have the gateway do
        it faster than its limit."""
        subjects = quota_subjects(principal)
        if subjects:
            await self._quota.charge_refused(subjects)

    async def prepare(
        self,
        service: Service[Request, Any],
        request: Request,
        principal: Principal,
        target: ModelTarget,
        request_id: str,
    ) -> Generation:
        """What admission would prepare of ``request`` (tokenised, checked), in the
        tenant's turn, without admitting it: a batch's lines are checked so before any runs."""
        return await self._prepare(service, request, principal, target, request_id, None)

    async def _prepare(
        self,
        service: Service[Request, Any],
        request: Request,
        principal: Principal,
        target: ModelTarget,
        request_id: str,
        body_bytes: int | None,
    ) -> Generation:
        """``service.prepare``, off the event loop unless the body is small and free of output
        constraints, in the tenant's turn on the tokenizer's thread (:class:`FairWorker`);
        then its constraint's compile check, in the tenant's turn on a thread of its own. The
        tokenizer is never used by two threads at once: the loop uses it only while its
        thread is idle."""
        small = body_bytes is not None and body_bytes <= INLINE_PREPARE_BYTES
        tenant = principal.tenant.id
        if small and self._tokenizer.idle and not wants_constraint(request):
            generation = service.prepare(request, principal, target, request_id)
        else:
            prepare = partial(service.prepare, request, principal, target, request_id)
            generation = await self._tokenizer.run(tenant, prepare)
        if generation.compile_check is not None:
            await self._compiler.run(tenant, generation.compile_check)
        return generation

    async def _on_this_host(
        self,
        target: ModelTarget,
        adapter: Adapter,
        holds: ExitStack,
        copy: AbstractContextManager[Path],
    ) -> ModelTarget:
        """``target`` with its adapter at this host's copy of the content (held in
        ``holds``), fetched first when the adapter store keeps it elsewhere (another replica
        registered it): in a thread, where entering the copy may wait."""
        if not self._held_copy_waits:
            path = holds.enter_context(copy)
        else:
            entering = asyncio.ensure_future(asyncio.to_thread(copy.__enter__))
            try:
                path = await asyncio.shield(entering)
            except asyncio.CancelledError:
                # The fetch runs on in its thread; what it holds once done is let go then.
                entering.add_done_callback(partial(_exit_once_entered, copy))
                raise
            holds.push(copy.__exit__)
        return (
            target if path == adapter.path else replace(target, adapter=replace(adapter, path=path))
        )

    async def _checked(self, check: Coroutine[Any, Any, T], tenant: Tenant) -> T:
        """``check``'s result; a quota refusal is counted by limit and by whose it was (in
        the metrics, and per minute in the store)."""
        try:
            return await check
        except (QuotaExceeded, QuotaTooLarge) as exc:
            limit = "too_large" if isinstance(exc, QuotaTooLarge) else exc.limit
            scope = "tenant" if exc.subject == tenant.quota_subject else "key"
            metrics.QUOTA_REJECTIONS.labels(tenant.id, limit, scope).inc()
            self._ledger.refused(tenant.uid, tenant.id, limit)
            raise

    async def _refused(
        self, run: Run, refusal: AdmissionRefused, access: AccessRecord | None
    ) -> None:
        """A request the scheduler refused never ran: its reservation is returned whole and
        it is counted as refused, with no usage record (like any refusal)."""
        await run.close()
        generation = run.generation
        if run.reservation is not None:
            await self._settle(run.reservation, 0)
        status = refusal.code or refusal.error_type
        metrics.REQUESTS.labels(
            generation.principal.tenant.id, generation.target.model, generation.endpoint, status
        ).inc()
        if access is not None:
            access.settled(status, 0, 0, None)

    async def _settle(self, reservation: Reservation, actual_tokens: int) -> None:
        """Reconcile ``reservation`` with what the request used: in place where the quota
        backend never waits (a task costs more than the settling), else in a task of its own,
        so that a store's round trip holds nothing up. Neither raises into the request."""
        settling = self._quota.reconcile(reservation, actual_tokens)
        if not self._quota.settles_in_place:
            self._spawn(settling)
            return
        try:
            await settling
        except Exception:
            logger.exception("could not settle reservation %s", reservation.id)

    @classmethod
    async def _released_after(cls, finish: Coroutine[Any, Any, None], run: Run, slot: Slot) -> None:
        """``finish``, then the engine slot back unless the request's end gave it back."""
        try:
            await finish
        finally:
            cls._give_back(run, slot)

    @staticmethod
    def _give_back(run: Run, slot: Slot) -> None:
        """The engine slot back, charged what the request really used (once: a slot
        already given back stays so)."""
        slot.settle(run.prompt_tokens + run.completion_tokens)
        slot.release()

    async def _finish(
        self,
        run: Run,
        outcome: Outcome,
        began: float,
        started_at: datetime,
        user: str | None,
        overhead: RequestOverhead,
        batch: BatchLine | None = None,
        access: AccessRecord | None = None,
    ) -> None:
        """Close the run, then settle and record with what it produced; then observe the
        request's overhead (and fill its access record)."""
        overhead.add("engine", run.gateway_seconds)
        request_trace = tracing.of(overhead)
        if request_trace is not None:
            timing = run.timing
            request_trace.ran(
                timing.first_token_at,
                timing.last_token_at,
                timing.finish_reason,
                outcome,
                run.failure,
            )
        overhead.begin("settlement")
        await run.close()
        generation = run.generation
        prompt_tokens, completion_tokens = run.prompt_tokens, run.completion_tokens
        if request_trace is not None:
            request_trace.used(prompt_tokens, completion_tokens)
        if run.reservation is not None:
            actual = prompt_tokens + completion_tokens
            if batch is not None and batch.cut_off(outcome):
                actual = 0  # not billed: charged nothing (docs/batches.md)
            await self._settle(run.reservation, actual)
        tenant, model, endpoint = (
            generation.principal.tenant.id,
            generation.target.model,
            (generation.endpoint),
        )
        metrics.add_held(_REQUESTS(tenant, model, endpoint, outcome))
        metrics.add_held(_PROMPT_TOKENS(tenant, model), prompt_tokens)
        metrics.add_held(_COMPLETION_TOKENS(tenant, model), completion_tokens)
        metrics.held(_REQUEST_DURATION(tenant, model, endpoint)).observe(time.monotonic() - began)
        record = self._record(run, outcome, began, started_at, user, batch)
        objectives = Objectives.of(generation.params.extra_args)
        if outcome == "ok" and objectives is not None and objectives.any:
            counted = slo_outcome(objectives, record.ttft_ms, record.itl_ms)
            priority = "interactive" if objectives.interactive else "batch"
            metrics.SLO_OUTCOMES.labels(priority, counted).inc()
        adapter = generation.target.adapter
        if adapter is not None and generation.target.split:
            version = str(adapter.version)
            metrics.SPLIT_REQUESTS.labels(tenant, model, version, outcome).inc()
            if record.ttft_ms is not None:
                ttft = record.ttft_ms / 1000
                metrics.SPLIT_TIME_TO_FIRST_TOKEN.labels(tenant, model, version).observe(ttft)
        overhead.end("settlement")
        overhead.observe()
        if access is not None:
            access.settled(outcome, prompt_tokens, completion_tokens, record.ttft_ms)

    def _record(
        self,
        run: Run,
        outcome: Outcome,
        began: float,
        started_at: datetime,
        user: str | None,
        batch: BatchLine | None = None,
    ) -> UsageRecord:
        """Write ``run``'s usage record (once it is closed), to the ledger or to the batch
        line's sink; the record."""
        generation = run.generation
        principal, adapter = generation.principal, generation.target.adapter
        record = UsageRecord(
            request_id=generation.request_id,
            tenant_id=principal.tenant.id,
            tenant_uid=principal.tenant.uid,
            key_id=principal.key_id,
            endpoint=generation.endpoint,
            model=generation.target.model,
            adapter=adapter.name if adapter else None,
            adapter_version=adapter.version if adapter else None,
            prompt_tokens=run.prompt_tokens,
            completion_tokens=run.completion_tokens,
            status=outcome,
            latency_ms=round((time.monotonic() - began) * 1000),
            started_at=started_at,
            finished_at=datetime.now(timezone.utc),
            user=user,
            shadow=generation.shadow,
            # An error the run did not see (the service failed around it) is the version's.
            fault=(run.fault or "version") if outcome == "error" else None,
            batch_id=batch.batch_id if batch is not None else None,
            **run.timing.usage_fields(began, run.completion_tokens),
        )
        (batch.records.append if batch is not None else self._ledger.record)(record)
        return record

    def why_unservable(self, adapter: Adapter) -> str | None:
        """Why ``adapter``'s version is refused before the engine (it failed to load, here or
        on another replica); ``None`` while it is served."""
        return adapter.unservable or self.unservable.get(adapter.lora_id)

    def _unservable(self, adapter: Adapter, reason: str) -> None:
        if adapter.lora_id in self.unservable:
            return
        logger.error(
            "adapter %s failed to load, refused from now on: %s", adapter.engine_name, reason
        )
        self.unservable[adapter.lora_id] = reason
        if self._on_unservable is not None:
            self._spawn(self._on_unservable(adapter, reason))

    async def _shadow(
        self,
        service: Service[Request, RunT],
        request: Request,
        generation: Generation,
        candidate: Adapter,
    ) -> None:
        """Run the request again on the ``candidate`` version, in spare capacity only, and
        record it as a shadow (never billed); its answer is discarded. Dropped when no spare
        capacity comes in time; stopped as soon as a request needs it."""
        tenant, model = generation.principal.tenant.id, generation.target.model
        if self.why_unservable(candidate):
            metrics.SHADOW_REQUESTS.labels(tenant, model, "dropped").inc()
            return
        task = asyncio.current_task()
        assert task is not None
        slot = await self._admission.spare(
            ticket_of(generation), task.cancel, wait=self._shadow_wait
        )
        if slot is None:
            metrics.SHADOW_REQUESTS.labels(tenant, model, "dropped").inc()
            return
        quiet = request.model_copy(update={"stream": False, "stream_options": None})
        # A shadow's answer is discarded: it carries the batch class's objectives, whose
        # turns never pause an interactive stream.
        params = generation.params.clone()
        carry(params, self._objectives.of(generation.principal.tenant, shadow=True))
        shadowed = replace(
            generation,
            request_id=f"{generation.request_id}-shadow",
            target=ModelTarget(model=model, adapter=candidate),
            params=params,
            shadow=True,
        )
        began, started_at = time.monotonic(), datetime.now(timezone.utc)
        outcome: Outcome = "error"
        try:
            with ExitStack() as holds:
                if self._held_copy is not None:
                    copy = self._held_copy(candidate.sha256)
                    target = await self._on_this_host(shadowed.target, candidate, holds, copy)
                    shadowed = replace(shadowed, target=target)
                run = service.start(quiet, shadowed, None)
                try:
                    await service.complete(quiet, run)
                    outcome = "ok"
                except asyncio.CancelledError:
                    outcome = "cancelled"
                    raise
                finally:
                    # Every token the engine produced is in the ledger, preempted or not.
                    await asyncio.shield(run.close())
                    self._record(run, outcome, began, started_at, request.user)
        except asyncio.CancelledError:
            outcome = "cancelled"  # a request needed the capacity, or the gateway stops
        except AdapterUnservableError as exc:
            self._unservable(candidate, exc.reason)
        except Exception:
            logger.info("shadow request %s failed", shadowed.request_id, exc_info=True)
        finally:
            slot.release()
        metrics.SHADOW_REQUESTS.labels(tenant, model, SHADOW_OUTCOMES[outcome]).inc()
