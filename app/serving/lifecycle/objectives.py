"""Each request's latency objectives, which travel with it to the engine's slot turns
(:mod:`app.inside_vllm.slot_sharing`), and its outcome against them; and the headroom's mark,
which travels the same way.

A request's class is its tenant's priority (a shadow's is batch: its answer is discarded);
its objectives are its tenant's own where it has them, else its class's from the settings.
Where neither the settings nor the tenant set any, the request carries its class alone and
its turns are the quantum's, as before objectives, except that a batch request's never pause
an interactive stream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vllm import SamplingParams

from app.inside_vllm.objectives import HEADROOM_KEY, TTFT_KEY, Objectives
from app.settings import Settings
from app.tenancy.tenants import Priority, Tenant

SloOutcome = Literal["met", "missed_ttft", "missed_tpot"]
# What is left of a TTFT objective the gateway's queue spent whole: positive, as the engine
# reads no objective from 0.
MIN_TTFT_MS = 0.001


@dataclass(frozen=True)
class ClassObjectives:
    """The settings' objectives of each priority class, in ms (None: none)."""

    ttft_ms: dict[Priority, float | None]
    tpot_ms: dict[Priority, float | None]

    @classmethod
    def from_settings(cls, settings: Settings) -> ClassObjectives:
        return cls(
            ttft_ms={
                "interactive": settings.slo_ttft_ms_interactive,
                "batch": settings.slo_ttft_ms_batch,
            },
            tpot_ms={
                "interactive": settings.slo_tpot_ms_interactive,
                "batch": settings.slo_tpot_ms_batch,
            },
        )

    def of(self, tenant: Tenant, *, shadow: bool = False) -> Objectives:
        """The class and objectives a request of ``tenant`` carries: its class always, so that
        the engine's turns never let a batch request pause an interactive stream, whatever
        objectives others carry; each objective its tenant's own, else its class's, else
        none."""
        priority: Priority = "batch" if shadow else tenant.priority
        ttft = tenant.slo_ttft_ms or self.ttft_ms.get(priority)
        tpot = tenant.slo_tpot_ms or self.tpot_ms.get(priority)
        return Objectives(
            interactive=priority == "interactive",
            ttft=None if ttft is None else ttft / 1000,
            tpot=None if tpot is None else tpot / 1000,
        )


def carry(params: SamplingParams, objectives: Objectives | None) -> None:
    """Put ``objectives`` in ``params``' ``extra_args``, where the engine core's scheduler
    reads them (none: ``params`` are left as they are)."""
    if objectives is not None:
        params.extra_args = {**(params.extra_args or {}), **objectives.extra_args()}


def carry_headroom(params: SamplingParams) -> None:
    """Mark ``params`` as let in through the front's headroom: the engine core seats the
    request at once, pausing one of the tenant running the most where its batch is full."""
    params.extra_args = {**(params.extra_args or {}), HEADROOM_KEY: 1}


def spend_wait(params: SamplingParams, waited: float) -> None:
    """Take the ``waited`` seconds the request spent in the gateway before the engine from its
    TTFT objective, where it carries one: the engine counts its deadline from the request's
    arrival there, the tenant from its admission here. Never down to nothing: a request due
    already is served as soon as the turns allow."""
    args = params.extra_args
    if args and TTFT_KEY in args:
        args[TTFT_KEY] = max(args[TTFT_KEY] - waited * 1000, MIN_TTFT_MS)


def outcome(objectives: Objectives, ttft_ms: float | None, tpot_ms: float | None) -> SloOutcome:
    """A finished request's outcome against its objectives: its first token's time (from its
    arrival at the gateway), then its mean time per token after the first. One with no first
    token missed its TTFT objective where it had one."""
    if objectives.ttft is not None and (ttft_ms is None or ttft_ms > objectives.ttft * 1000):
        return "missed_ttft"
    if objectives.tpot is not None and tpot_ms is not None and tpot_ms > objectives.tpot * 1000:
        return "missed_tpot"
    return "met"
