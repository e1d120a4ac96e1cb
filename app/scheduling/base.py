"""The admission interface between the request path and the engine.

A request that has passed its quotas asks :meth:`Admission.admit` for a :class:`Slot` and
holds it for its whole time in the engine: ``await slot.acquire()`` waits for its turn (or
raises :class:`~app.scheduling.errors.AdmissionRefused`), ``slot.release()`` gives it back once
the engine request has finished, charged what it used (``slot.settle``). Which policy decides
the order is chosen once, by :func:`app.scheduling.admission_for`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from app.engine.base import Engine


@dataclass(frozen=True)
class Ticket:
    """What the scheduler knows of one request."""

    request_id: str
    tenant: str
    # The tenant's share of the engine relative to other tenants' (Tenant.weight).
    weight: int
    # Worst-case tokens: prompt + n x max_tokens (what the quota reserves).
    cost: int
    # The adapter version's engine id (lora_id); None: the base model.
    adapter: int | None = None
    # Sequences the request puts in the engine's batch (its n).
    seqs: int = 1
    # The tenant's class: a batch tenant never takes the headroom kept for newcomers.
    interactive: bool = True
    # It has an output constraint: the engine builds its grammar during the steps that
    # decode it, which lengthens each of those steps for every request in the batch.
    constrained: bool = False
    # A line of a tenant's batch (docs/batches.md): let in only while no interactive request
    # waits (here or inside the engine), and, beside interactive requests, only into the
    # seats and the share of each engine step's tokens batch lines may take.
    batch_line: bool = False


class Slot(Protocol):
    """A request's place in the engine: waited for once, given back once."""

    # Once acquired: it went in beyond the batch the tenants share, through the headroom kept
    # for a tenant below its share, and carries the mark that has the engine seat it at once.
    through_headroom: bool

    async def acquire(self) -> None:
        """Wait for the request's turn. Cancelled, it leaves the queue at once and holds
        nothing; refused (queue full, waited too long), it raises ``AdmissionRefused``."""

    def settle(self, tokens: int) -> None:
        """The tokens the request really used (prompt + completion), known at its end: the
        scheduler charges the tenant these instead of the worst case."""

    def started(self) -> None:
        """The request's first token arrived: it no longer waits inside the engine (for its
        queue, a device slot or its prompt's step). Until then an interactive request counts
        as waiting, and batch lines do not go in over it."""

    def release(self) -> None:
        """Give the slot back (idempotent; a no-op when it was never acquired)."""


class Admission(Protocol):
    """A policy that decides when each request enters the engine."""

    def admit(self, ticket: Ticket) -> Slot:
        """The request's slot, not yet acquired."""

    async def spare(
        self, ticket: Ticket, preempt: Callable[[], object], *, wait: float
    ) -> Slot | None:
        """A slot, already acquired, for work that may only use capacity no request wants (a
        shadow request), once there is some within ``wait`` seconds; else None (the work is
        dropped). ``preempt`` is called when a request needs the capacity: the work must
        then stop, and release its slot."""

    def follow(self, engine: Engine | None) -> None:
        """The engine the requests go to, once it runs (``None`` once it stops): a policy may
        follow its load."""
