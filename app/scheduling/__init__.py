"""Admission to the engine: which request goes in next, and which waits (``docs/scheduling.md``).

The policy in front of the in-process engine is chosen here, once, from the settings:
:class:`FairAdmission` (per-tenant weighted queues, adapter-aware, with headroom) by default,
:class:`FcfsAdmission` with ``scheduler=fcfs``. The front role admits first come, first
served (:class:`app.serving.front.backend.FrontFactory`).
"""

from __future__ import annotations

from app.scheduling.base import Admission, Slot, Ticket
from app.scheduling.errors import AdmissionRefused
from app.scheduling.fair import FairAdmission
from app.scheduling.fcfs import FcfsAdmission
from app.scheduling.policy import FairQueue
from app.scheduling.window import AdaptiveWindow
from app.settings import Settings

__all__ = [
    "AdaptiveWindow",
    "Admission",
    "AdmissionRefused",
    "FairAdmission",
    "FairQueue",
    "FcfsAdmission",
    "Slot",
    "Ticket",
    "admission_for",
]


def admission_for(settings: Settings) -> Admission:
    """The admission policy ``settings`` ask for."""
    if settings.scheduler == "fcfs":
        return FcfsAdmission()
    # The tenants share the engine's batch: a window set in the settings, or one that follows
    # the engine's load up to the most vLLM batches. The headroom goes in beyond it, and the
    # engine seats its requests by pausing one of the tenant running the most (no seat idles
    # waiting for a newcomer).
    fixed = settings.scheduler_window
    headroom = settings.scheduler_headroom_slots
    window = None if fixed is not None else AdaptiveWindow(cap=settings.max_num_seqs, floor=1)
    queue = FairQueue(
        window=(fixed or settings.max_num_seqs) + headroom,
        headroom=headroom,
        quantum=settings.scheduler_quantum_tokens,
        max_adapter_wait=settings.scheduler_max_adapter_wait_seconds,
        max_loras=settings.max_loras,
        # An engine that shares its slots in turns (by the quantum, or by objectives) runs a
        # request that crowds them.
        hold_crowding=settings.lora_slot_quantum_tokens == 0 and not settings.has_objectives,
        per_step=settings.scheduler_dispatches_per_step,
        max_constrained=settings.scheduler_max_constrained_per_tenant,
        batch_share=settings.scheduler_batch_share,
        batch_step_tokens=settings.scheduler_batch_step_tokens,
    )
    return FairAdmission(
        queue,
        max_queue_depth=settings.scheduler_max_queue_depth,
        max_queue_seconds=settings.scheduler_max_queue_seconds,
        window=window,
    )
