"""The fair admission policy, as plain data: who goes next into the engine.

Deterministic and synchronous (time is an argument), so every rule is tested without an event
loop; :mod:`app.scheduling.fair` drives it.

* **Window.** At most ``window`` sequences are in the engine at once. Beyond it requests wait
  here, in one FIFO queue per tenant.
* **Deficit round robin on tokens.** Tenants with waiting requests form a ring. Each visit
  credits a tenant ``quantum x weight`` tokens; it dispatches its oldest request while its
  credit covers the request's cost (prompt + n x max_tokens), then the next tenant's visit
  begins. :meth:`FairQueue.pop` skips ahead over the visits in which nobody could dispatch
  (they only add credit), so a pick costs one pass over the ring whatever the quantum. When a
  request ends, the difference between its worst case and what it used goes back to its
  tenant's credit. A tenant with nothing waiting keeps no credit (classic DRR).
* **Adapter affinity.** The tenants that would dispatch in the same round of the ring have an
  equal claim; among them the one whose request's adapter is resident (or the base model)
  goes first, then one whose adapter fits beside the running ones (``max_loras``), then the
  rest, each group in ring order.
* **Age bound.** Among equal claims, a request that waited ``max_adapter_wait`` or longer goes
  first (the oldest), whatever its adapter: affinity may delay a request, never starve it.
* **Headroom.** The last ``headroom`` slots of the window only go to a tenant below its fair
  share of the rest (``(window - headroom) x weight / the active tenants' weights``) whose
  priority class is interactive (a batch tenant can wait for the next free slot): a tenant
  that floods the engine leaves room for a newcomer, which then never waits for the flood's
  long streams to end. Alone, a tenant runs at most ``window - headroom`` sequences.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from app.scheduling.affinity import AdapterAffinity
from app.scheduling.base import Ticket

Reason = Literal["immediate", "fair_share", "adapter_affinity", "age"]
REASONS: tuple[Reason, ...] = ("immediate", "fair_share", "adapter_affinity", "age")


@dataclass(eq=False)
class Waiting:
    """One queued request."""

    ticket: Ticket
    since: float
    queued: bool = True


@dataclass(eq=False)
class TenantState:
    weight: int
    queue: deque[Waiting] = field(default_factory=deque)
    deficit: float = 0.0
    in_flight: int = 0  # sequences in the engine
    # Moves each time the tenant's credit is reset (its queue emptied): a request charged
    # before then is refunded nothing, its charge having been forgotten with the credit.
    epoch: int = 0


@dataclass(frozen=True)
class Dispatch:
    waiting: Waiting
    reason: Reason


class _Claim(NamedTuple):
    rounds: int  # whole rounds of the ring before the tenant can dispatch
    offset: int  # its place in the ring from the cursor (0: continuing its visit)
    name: str
    state: TenantState
    head: Waiting


class FairQueue:
    def __init__(
        self,
        *,
        window: int,
        headroom: int,
        quantum: int,
        max_adapter_wait: float,
        max_loras: int,
    ) -> None:
        self.window = window
        # At least one slot stays open to a tenant alone.
        self.headroom = min(headroom, window - 1)
        self.quantum = quantum
        self.max_adapter_wait = max_adapter_wait
        self.affinity = AdapterAffinity(max_loras)
        self.in_flight = 0
        self._tenants: dict[str, TenantState] = {}
        self._weights = 0  # of the tenants above: queued or in flight
        # request id -> the tenant's epoch when it was charged, while a refund may apply
        self._charged: dict[str, int] = {}
        # Nobody could dispatch at the last pop, and nothing that could change that (a new
        # head of a queue, a request ending or leaving) has happened since: pop need not look.
        self._blocked = False
        # Tenants with waiting requests, in visiting order from the cursor on.
        self._ring: list[str] = []
        self._cursor = -1
        self._visiting: str | None = None

    # -- reading ------------------------------------------------------------------

    def depth(self, tenant: str) -> int:
        state = self._tenants.get(tenant)
        return len(state.queue) if state else 0

    def waiting(self) -> int:
        return sum(len(state.queue) for state in self._tenants.values())

    def in_flight_of(self, tenant: str) -> int:
        state = self._tenants.get(tenant)
        return state.in_flight if state else 0

    def share(self, tenant: str, weight: int) -> float:
        """The tenant's fair share of the window below the headroom, in sequences, were it
        active beside the tenants active now."""
        state = self._tenants.get(tenant)
        others = self._weights - (state.weight if state else 0)
        return (self.window - self.headroom) * weight / (others + weight)

    # -- changing -----------------------------------------------------------------

    def push(self, ticket: Ticket, now: float) -> Waiting:
        state = self._tenants.get(ticket.tenant)
        if state is None:
            state = self._tenants[ticket.tenant] = TenantState(0)
        self._weights += ticket.weight - state.weight
        state.weight = ticket.weight  # the registry's latest
        waiting = Waiting(ticket, now)
        if not state.queue:
            self._enter_ring(ticket.tenant)
            self._blocked = False
        state.queue.append(waiting)
        return waiting

    def remove(self, waiting: Waiting) -> None:
        """Take a request out of its queue (its client left, or it waited too long)."""
        if not waiting.queued:
            return
        waiting.queued = False
        self._blocked = False
        name = waiting.ticket.tenant
        state = self._tenants[name]
        state.queue.remove(waiting)
        if not state.queue:
            self._leave_ring(name)
        self._forget_if_idle(name)

    def pop(self, now: float) -> Dispatch | None:
        """The next request to dispatch, if the window lets any in; it is then in flight."""
        if self.in_flight >= self.window or not self._ring or self._blocked:
            return None
        claims = self._claims()
        if not claims:
            self._blocked = True
            return None
        first_round = min(claim.rounds for claim in claims)
        # In ring order already, but for a visit that continues (offset 0, listed last).
        equal = sorted((c for c in claims if c.rounds == first_round), key=lambda c: c.offset)
        winner = in_order = preferred = equal[0]
        aged = False
        if len(equal) > 1:
            fit = self.affinity.fit
            preferred = min(equal, key=lambda c: (fit(c.head.ticket.adapter), c.offset))
            oldest = min(equal, key=lambda c: (c.head.since, c.offset))
            aged = now - oldest.head.since >= self.max_adapter_wait
            winner = oldest if aged else preferred
        reason: Reason = (
            "age"
            if winner is not preferred
            else "fair_share"
            if winner is in_order
            else "adapter_affinity"
        )
        if winner.offset:
            for claim in claims:
                visits = first_round + (1 if claim.offset <= winner.offset else 0)
                claim.state.deficit += visits * self.quantum * claim.state.weight
        return Dispatch(self._take(winner.name), reason)

    def done(self, ticket: Ticket, used: int | None) -> None:
        """A dispatched request left the engine, having used ``used`` tokens (None: unknown,
        charged its worst case)."""
        state = self._tenants.get(ticket.tenant)
        if state is None:
            return
        seqs = self._seqs(ticket)
        state.in_flight -= seqs
        self.in_flight -= seqs
        self._blocked = False
        self.affinity.finished(ticket.adapter)
        charged = self._charged.pop(ticket.request_id, None)
        if used is not None and charged == state.epoch:
            state.deficit += max(0, ticket.cost - used)
        self._forget_if_idle(ticket.tenant)

    # -- the ring -----------------------------------------------------------------

    def _claims(self) -> list[_Claim]:
        """Who could dispatch now, and after how many rounds of credit."""
        claims = []
        window, in_flight, quantum = self.window, self.in_flight, self.quantum
        unreserved = window - self.headroom
        ring, tenants, count = self._ring, self._tenants, len(self._ring)
        for offset in range(1, count + 1):
            name = ring[(self._cursor + offset) % count]
            state = tenants[name]
            head = state.queue[0]
            ticket = head.ticket
            seqs = ticket.seqs if ticket.seqs <= window else window
            after = in_flight + seqs
            # An empty engine takes any request, however many sequences it has.
            if (
                after > unreserved
                and in_flight > 0
                and (
                    after > window
                    or not ticket.interactive
                    # Headroom: only a tenant below its share of the unreserved window.
                    or state.in_flight + seqs > unreserved * state.weight / self._weights
                )
            ):
                continue
            need = ticket.cost - state.deficit
            if name == self._visiting and need <= 0:
                claims.append(_Claim(0, 0, name, state, head))
                continue
            rounds = max(0, math.ceil(need / (quantum * state.weight)) - 1)
            claims.append(_Claim(rounds, offset, name, state, head))
        return claims

    def _take(self, name: str) -> Waiting:
        state = self._tenants[name]
        waiting = state.queue.popleft()
        waiting.queued = False
        ticket = waiting.ticket
        state.deficit -= ticket.cost
        seqs = self._seqs(ticket)
        state.in_flight += seqs
        self.in_flight += seqs
        self.affinity.started(ticket.adapter)
        self._cursor = self._ring.index(name)
        self._visiting = name
        if state.queue:
            self._charged[ticket.request_id] = state.epoch
        else:
            self._leave_ring(name)
        return waiting

    def _seqs(self, ticket: Ticket) -> int:
        return max(1, min(ticket.seqs, self.window))

    def _enter_ring(self, name: str) -> None:
        # Last in the visiting order, which runs from the tenant after the cursor round to
        # the cursor: the cursor moves onto the newcomer.
        self._cursor += 1
        self._ring.insert(self._cursor, name)

    def _leave_ring(self, name: str) -> None:
        index = self._ring.index(name)
        del self._ring[index]
        state = self._tenants[name]
        state.deficit = 0.0
        state.epoch += 1
        if name == self._visiting:
            self._visiting = None
        if index <= self._cursor:
            self._cursor -= 1
        if not self._ring:
            self._cursor = -1

    def _forget_if_idle(self, name: str) -> None:
        state = self._tenants.get(name)
        if state is not None and not state.queue and state.in_flight <= 0:
            del self._tenants[name]
            self._weights -= state.weight
