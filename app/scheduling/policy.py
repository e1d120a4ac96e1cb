"""The fair admission policy, as plain data: who goes next into the engine.

At most a window of sequences is in the engine; beyond it requests wait here, one queue per
tenant, and go in by deficit round robin on tokens (``quantum x weight`` a visit), with
adapter affinity (a request whose adapter cannot run waits here, not inside vLLM), an age
bound, optional pacing per engine step, a cap on a tenant's constrained requests, headroom
kept for tenants below their fair share, and batch lines let in only into the capacity
interactive requests leave. The rules, their reasons and what they cost are
written once, in docs/scheduling.md. Deterministic and synchronous (time is an argument), so
every rule is tested without an event loop; :mod:`app.scheduling.fair` drives it.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Literal

from app.scheduling.affinity import FITS, AdapterAffinity
from app.scheduling.base import Ticket

Reason = Literal["immediate", "fair_share", "adapter_affinity", "age"]


@dataclass(eq=False)
class Waiting:
    """One queued request."""

    ticket: Ticket
    since: float
    queued: bool = True
    # Let in beyond the batch the tenants share, through the headroom: the engine takes a
    # seat back for it (docs/scheduling.md, "Headroom").
    through_headroom: bool = False


@dataclass(eq=False)
class TenantState:
    weight: int
    queue: deque[Waiting] = field(default_factory=deque)
    deficit: float = 0.0
    in_flight: int = 0  # sequences in the engine
    constrained: int = 0  # requests with an output constraint in the engine
    # Moves each time the tenant's credit is reset (its queue emptied): a request charged
    # before then is refunded nothing, its charge having been forgotten with the credit.
    epoch: int = 0


@dataclass(frozen=True)
class Dispatch:
    waiting: Waiting
    reason: Reason


class FairQueue:
    def __init__(
        self,
        *,
        window: int,
        headroom: int,
        quantum: int,
        max_adapter_wait: float,
        max_loras: int,
        hold_crowding: bool = True,
        per_step: int = 0,
        max_constrained: int = 1,
        batch_share: float = 1.0,
        batch_step_tokens: int = 0,
    ) -> None:
        self.window = window
        # Beside interactive requests, batch lines hold at most this share of the window (at
        # least one seat), and take at most ``batch_step_tokens`` worst-case tokens per engine
        # step on average (0: no such cap); alone, neither.
        self.batch_share = batch_share
        self.batch_step_tokens = batch_step_tokens
        self.batch_in_flight = 0
        self._batch_credit = float(batch_step_tokens)
        self._interactive_waiting = 0
        self._interactive_in_flight = 0
        # Interactive requests in the engine with no first token yet: they wait there (for its
        # queue, a device slot, their prompt's step) and count as waiting for batch lines.
        self._unstarted: set[str] = set()
        self._steps_reported = False
        self.max_constrained = max_constrained
        self.per_step = per_step
        self._paced = False
        self._this_step = 0  # requests let in since the engine's last step
        self.headroom_slots = headroom
        # At least one slot stays open to a tenant alone.
        self.headroom = min(headroom, window - 1)
        self.quantum = quantum
        self.max_adapter_wait = max_adapter_wait
        self.affinity = AdapterAffinity(max_loras, hold=hold_crowding)
        self.in_flight = 0
        self._tenants: dict[str, TenantState] = {}
        self._demand: Counter[int | None] = Counter()  # waiting requests per adapter
        self._weights = 0  # of the tenants above: queued or in flight
        # request id -> the tenant's epoch when it was charged, while a refund may apply
        self._charged: dict[str, int] = {}
        # Nobody could dispatch at the last pop, and nothing that could change that (a new
        # request where none could run, a request ending or leaving) has happened since: pop
        # need not look.
        self._blocked = False
        # Tenants with waiting requests, in the order they started waiting.
        self._backlogged: dict[str, None] = {}
        # Those still to be visited in the current pass.
        self._pending: set[str] = set()
        # The tenant whose visit is under way: it dispatches on while its credit lasts.
        self._visiting: str | None = None

    # -- reading ------------------------------------------------------------------

    def depth(self, tenant: str) -> int:
        state = self._tenants.get(tenant)
        return len(state.queue) if state else 0

    def waiting(self) -> int:
        return sum(len(state.queue) for state in self._tenants.values())

    def share(self, tenant: str, weight: int) -> float:
        """The tenant's fair share of the window below the headroom, in sequences, were it
        active beside the tenants active now."""
        state = self._tenants.get(tenant)
        others = self._weights - (state.weight if state else 0)
        return (self.window - self.headroom) * weight / (others + weight)

    def interactive_waiting(self) -> bool:
        """Whether an interactive request waits: here, or in the engine for its first token."""
        return bool(self._interactive_waiting or self._unstarted)

    def batch_alone(self) -> bool:
        """Whether batch lines have the engine to themselves: no interactive request is in it
        or waiting. It holds from the moment the last one ends, and stops as one arrives."""
        return not self._interactive_in_flight and not self._interactive_waiting

    def batch_seats(self) -> int:
        """The seats batch lines may hold now: the window less the headroom, alone; beside
        interactive requests, their share of the window (at least one)."""
        if self.batch_alone():
            return self.window - self.headroom
        return max(1, int(self.window * self.batch_share))

    def held_back(self) -> bool:
        """Whether requests wait that a larger window would let in: the window is the limit,
        not the tenants' shares."""
        return bool(self._backlogged) and self.in_flight >= self.window - self.headroom

    # -- changing -----------------------------------------------------------------

    def pace(self, on: bool) -> None:
        """Count dispatches per engine step (:meth:`new_step`); only an engine that reports
        its steps can be paced."""
        self._paced = on and self.per_step > 0
        self._steps_reported = on
        self._this_step = 0
        self._blocked = False

    def new_step(self, steps: int = 1) -> None:
        """The engine reported ``steps`` more steps: pacing opens anew, and batch lines gain
        ``steps`` steps' worth of tokens, never more than one step's in hand."""
        self._this_step = 0
        self._blocked = False
        budget = self.batch_step_tokens
        self._batch_credit = min(float(budget), self._batch_credit + steps * budget)

    def started(self, ticket: Ticket) -> None:
        """The dispatched request's first token arrived: it no longer waits in the engine."""
        if ticket.request_id in self._unstarted:
            self._unstarted.discard(ticket.request_id)
            self._blocked = False

    def resize(self, window: int) -> None:
        """A new window; requests in flight beyond it stay, and no more go in until they end."""
        self.window = window
        self.headroom = min(self.headroom_slots, window - 1)
        self._blocked = False

    def push(self, ticket: Ticket, now: float) -> Waiting:
        state = self._tenants.get(ticket.tenant)
        if state is None:
            state = self._tenants[ticket.tenant] = TenantState(0)
        self._weights += ticket.weight - state.weight
        state.weight = ticket.weight  # the registry's latest
        waiting = Waiting(ticket, now)
        self._demand[ticket.adapter] += 1
        self._interactive_waiting += ticket.interactive
        if not state.queue:
            self._backlogged[ticket.tenant] = None
            self._pending.add(ticket.tenant)
            self._blocked = False
        elif self._runnable(state) is None:
            # Every request of the tenant is held (adapter, constrained cap): the new one
            # may be the first that can run.
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
        self._no_longer_waiting(waiting.ticket)
        if not state.queue:
            self._stop_waiting(name)
        self._forget_if_idle(name)

    def pop(self, now: float) -> Dispatch | None:
        """The next request to dispatch, if the window lets any in; it is then in flight."""
        if self.in_flight >= self.window or not self._backlogged or self._blocked:
            return None
        visiting = self._visiting
        if visiting is not None:
            state = self._tenants[visiting]
            next_up = self._runnable(state)
            if (
                next_up is not None
                and state.deficit >= next_up.ticket.cost
                and self._admissible(state, next_up.ticket)
            ):
                reason = self._reason(state, next_up)
                return Dispatch(self._take(visiting, next_up), reason)
        candidates, held_ahead = self._dispatchable(now)
        if not candidates:
            self._next_pass()
            candidates, held_ahead = self._dispatchable(now)
            if not candidates:
                self._blocked = True
                return None
        in_order = preferred = winner = next(iter(candidates))
        if len(candidates) > 1:
            order = {name: index for index, name in enumerate(candidates)}
            preferred = min(candidates, key=lambda n: (*self._claim(candidates[n]), order[n]))
            oldest = min(candidates, key=lambda n: (candidates[n].since, order[n]))
            if now - candidates[oldest].since >= self.max_adapter_wait:
                winner = oldest
            else:
                winner = preferred
        state, next_up = self._tenants[winner], candidates[winner]
        reason = (
            "age"
            if winner != preferred
            else "fair_share"
            if winner == in_order and not held_ahead
            else "adapter_affinity"
        )
        if reason != "age":
            reason = self._reason(state, next_up, reason)
        # The winner's visit in this pass.
        state.deficit += self.quantum * state.weight
        self._pending.discard(winner)
        return Dispatch(self._take(winner, next_up), reason)

    def done(self, ticket: Ticket, used: int | None) -> None:
        """A dispatched request left the engine, having used ``used`` tokens (None: unknown,
        charged its worst case)."""
        state = self._tenants.get(ticket.tenant)
        if state is None:
            return
        seqs = self._seqs(ticket)
        state.in_flight -= seqs
        self.in_flight -= seqs
        if ticket.batch_line:
            self.batch_in_flight -= seqs
        if ticket.interactive:
            self._unstarted.discard(ticket.request_id)
            self._interactive_in_flight -= seqs
        self._blocked = False
        self.affinity.finished(ticket.adapter)
        if ticket.constrained:
            state.constrained -= 1
        charged = self._charged.pop(ticket.request_id, None)
        if used is not None and charged == state.epoch:
            state.deficit += max(0, ticket.cost - used)
        self._forget_if_idle(ticket.tenant)

    # -- passes -------------------------------------------------------------------

    def _dispatchable(self, now: float) -> tuple[dict[str, Waiting], bool]:
        """The tenants still to be visited in this pass whose visit would dispatch, in the
        order they started waiting, each with the request it would send; and whether one due
        a visit before the first of them is held back for its adapter. A slot is drained for
        a request held back past the age bound."""
        quantum, tenants, pending = self.quantum, self._tenants, self._pending
        affinity = self.affinity
        found: dict[str, Waiting] = {}
        held_ahead = False
        for name in self._backlogged:
            state = tenants[name]
            head = state.queue[0]
            next_up: Waiting | None = head
            if self._over_cap(state, head.ticket):
                # Held for its tenant's constrained requests, not for its adapter: no slot
                # is drained for it, whatever its age.
                next_up = self._runnable(state)
            elif affinity.crowds(head.ticket.adapter):
                held_ahead = held_ahead or (not found and name in pending)
                if now - head.since >= self.max_adapter_wait and head.ticket.adapter is not None:
                    affinity.make_room(head.ticket.adapter)
                next_up = self._runnable(state)
            if (
                next_up is not None
                and name in pending
                and state.deficit + quantum * state.weight >= next_up.ticket.cost
                and self._admissible(state, next_up.ticket)
            ):
                found[name] = next_up
        return found, held_ahead

    def _runnable(self, state: TenantState) -> Waiting | None:
        """The tenant's oldest request that can run now: its adapter can, and it is not a
        constrained one beyond the tenant's cap."""
        crowds, over_cap = self.affinity.crowds, self._over_cap
        for waiting in state.queue:
            if not over_cap(state, waiting.ticket) and not crowds(waiting.ticket.adapter):
                return waiting
        return None

    def _over_cap(self, state: TenantState, ticket: Ticket) -> bool:
        """Whether the request is constrained and its tenant has as many of those running
        as it may."""
        return ticket.constrained and state.constrained >= self.max_constrained

    def _reason(
        self, state: TenantState, next_up: Waiting, reason: Reason = "fair_share"
    ) -> Reason:
        """Why ``next_up`` goes now: into a slot kept for it past the age bound, in place of
        an older request of its tenant whose adapter cannot run, or ``reason`` (passing only
        constrained requests held for the cap reorders nothing for adapters)."""
        adapter = next_up.ticket.adapter
        if adapter is not None and adapter == self.affinity.reserved:
            return "age"
        if next_up is state.queue[0]:
            return reason
        over_cap = self._over_cap
        first = next(w for w in state.queue if w is next_up or not over_cap(state, w.ticket))
        return "adapter_affinity" if next_up is not first else reason

    def _claim(self, waiting: Waiting) -> tuple[int, int]:
        """How a request ranks among equal claims: resident adapters first, then those that
        fit, the one most requests wait for first."""
        adapter = waiting.ticket.adapter
        fit = self.affinity.fit(adapter)
        return fit, -self._demand[adapter] if fit == FITS else 0

    def _next_pass(self) -> None:
        """End the pass (the tenants not visited yet are, without dispatching) and begin the
        next, skipping ahead over the passes in which nobody could dispatch either."""
        quantum, tenants = self.quantum, self._tenants
        admissible: dict[int, tuple[TenantState, Ticket]] = {}
        for state in (tenants[name] for name in self._backlogged):
            next_up = self._runnable(state)
            if next_up is not None and self._admissible(state, next_up.ticket):
                admissible[id(state)] = state, next_up.ticket
        if not admissible:
            return
        for name in self._pending:
            state = tenants[name]
            if id(state) in admissible:
                state.deficit += quantum * state.weight
        self._pending = set(self._backlogged)
        self._visiting = None
        passes = min(
            math.ceil((ticket.cost - state.deficit) / (quantum * state.weight))
            for state, ticket in admissible.values()
        )
        if passes > 1:
            for state, _ in admissible.values():
                state.deficit += (passes - 1) * quantum * state.weight

    def _admissible(self, state: TenantState, ticket: Ticket) -> bool:
        """Whether the window lets the request in now (headroom and pacing included)."""
        window, in_flight = self.window, self.in_flight
        if self._paced and self._this_step >= self.per_step and state.in_flight > 0:
            return False
        seqs = ticket.seqs if ticket.seqs <= window else window
        if ticket.batch_line and not self._batch_may_go(seqs):
            return False
        after = in_flight + seqs
        unreserved = window - self.headroom
        # An empty engine takes any request, however many sequences it has.
        return (
            after <= unreserved
            or in_flight == 0
            or (
                after <= window
                and ticket.interactive
                # Headroom: only a tenant below its share of the unreserved window.
                and state.in_flight + seqs <= unreserved * state.weight / self._weights
            )
        )

    def _batch_may_go(self, seqs: int) -> bool:
        """Whether a batch line may go in: never while an interactive request waits (here or
        inside the engine); alone, into the window as any request; beside interactive
        requests, into its seats, and while the lines' share of the engine's steps has tokens
        left (one line at least is always in flight: it keeps the engine's steps coming)."""
        if self.interactive_waiting():
            return False
        if self.batch_in_flight + seqs > self.batch_seats():
            return False
        return not self._batch_step_capped() or self._batch_credit > 0 or not self.batch_in_flight

    def _batch_step_capped(self) -> bool:
        """Whether batch lines are held to their tokens per engine step now: only beside
        interactive requests, and where the engine reports its steps."""
        return self._steps_reported and self.batch_step_tokens > 0 and not self.batch_alone()

    def _take(self, name: str, waiting: Waiting) -> Waiting:
        state = self._tenants[name]
        if waiting is state.queue[0]:
            state.queue.popleft()
        else:
            state.queue.remove(waiting)
        waiting.queued = False
        ticket = waiting.ticket
        self._no_longer_waiting(ticket)
        state.deficit -= ticket.cost
        seqs = self._seqs(ticket)
        waiting.through_headroom = (
            self.in_flight > 0 and self.in_flight + seqs > self.window - self.headroom
        )
        state.in_flight += seqs
        self.in_flight += seqs
        if ticket.batch_line:
            if self._batch_step_capped():
                self._batch_credit -= ticket.cost
            self.batch_in_flight += seqs
        if ticket.interactive:
            self._interactive_in_flight += seqs
            self._unstarted.add(ticket.request_id)
        self._this_step += 1
        self.affinity.started(ticket.adapter)
        if ticket.constrained:
            state.constrained += 1
        self._visiting = name
        if state.queue:
            self._charged[ticket.request_id] = state.epoch
        else:
            self._stop_waiting(name)
        return waiting

    def _no_longer_waiting(self, ticket: Ticket) -> None:
        self._interactive_waiting -= ticket.interactive
        demand = self._demand
        demand[ticket.adapter] -= 1
        if not demand[ticket.adapter]:
            del demand[ticket.adapter]
            self.affinity.forgo(ticket.adapter)

    def _seqs(self, ticket: Ticket) -> int:
        # Not capped by the window, which may change while the request runs: what a request
        # adds to in_flight when it goes in is what it takes away when it ends.
        return max(1, ticket.seqs)

    def _stop_waiting(self, name: str) -> None:
        del self._backlogged[name]
        self._pending.discard(name)
        state = self._tenants[name]
        state.deficit = 0.0
        state.epoch += 1
        if name == self._visiting:
            self._visiting = None

    def _forget_if_idle(self, name: str) -> None:
        state = self._tenants.get(name)
        if state is not None and not state.queue and state.in_flight <= 0:
            del self._tenants[name]
            self._weights -= state.weight
