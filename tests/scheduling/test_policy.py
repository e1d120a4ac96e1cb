"""The fair admission policy, step by step: no event loop, time passed in."""

from __future__ import annotations

from collections import Counter

import pytest

from app.scheduling import FairQueue, Ticket
from app.scheduling.policy import Dispatch

SMALL = 100


def queue(
    *,
    window: int = 1,
    headroom: int = 0,
    quantum: int = SMALL,
    max_adapter_wait: float = 10.0,
    max_loras: int = 2,
    max_constrained: int = 1,
    hold_crowding: bool = True,
) -> FairQueue:
    return FairQueue(
        window=window,
        headroom=headroom,
        quantum=quantum,
        max_adapter_wait=max_adapter_wait,
        max_loras=max_loras,
        max_constrained=max_constrained,
        hold_crowding=hold_crowding,
    )


def ticket(
    tenant: str,
    number: int,
    *,
    weight: int = 1,
    cost: int = SMALL,
    adapter: int | None = None,
    constrained: bool = False,
) -> Ticket:
    return Ticket(f"{tenant}-{number}", tenant, weight, cost, adapter, constrained=constrained)


def drain(fair: FairQueue, count: int, now: float = 0.0) -> list[Dispatch]:
    """Dispatch ``count`` requests one at a time, each ending before the next starts."""
    dispatched = []
    for _ in range(count):
        dispatch = fair.pop(now)
        assert dispatch is not None
        dispatched.append(dispatch)
        fair.done(dispatch.waiting.ticket, None)
    return dispatched


@pytest.mark.parametrize(("light", "heavy"), [(1, 1), (1, 3), (2, 5)])
def test_tenants_are_served_tokens_in_proportion_to_their_weights(light: int, heavy: int) -> None:
    fair = queue()
    for number in range(200):
        fair.push(ticket("a", number, weight=light), 0.0)
        fair.push(ticket("b", number, weight=heavy), 0.0)
    served = Counter(d.waiting.ticket.tenant for d in drain(fair, 140))
    assert served["b"] / served["a"] == pytest.approx(heavy / light, rel=0.1)


def test_shares_are_in_tokens_not_requests() -> None:
    fair = queue()
    for number in range(100):
        fair.push(ticket("long", number, cost=4 * SMALL), 0.0)
        fair.push(ticket("short", number, cost=SMALL), 0.0)
    served = Counter(d.waiting.ticket.tenant for d in drain(fair, 50))
    assert served["short"] == pytest.approx(4 * served["long"], abs=2)


def test_requests_of_one_tenant_go_in_arrival_order() -> None:
    fair = queue(window=3)
    for number in range(5):
        fair.push(ticket("a", number), float(number))
        fair.push(ticket("b", number), float(number))
    order = [d.waiting.ticket.request_id for d in drain(fair, 10, now=5.0)]
    assert [r for r in order if r.startswith("a")] == [f"a-{n}" for n in range(5)]
    assert [r for r in order if r.startswith("b")] == [f"b-{n}" for n in range(5)]


def test_a_new_tenant_is_not_behind_a_backlog() -> None:
    fair = queue()
    for number in range(50):
        fair.push(ticket("flood", number), 0.0)
    drain(fair, 3)
    fair.push(ticket("new", 0), 1.0)
    upcoming = [d.waiting.ticket.tenant for d in drain(fair, 3, now=1.0)]
    assert "new" in upcoming


def test_the_window_bounds_what_is_in_flight() -> None:
    fair = queue(window=3)
    for number in range(5):
        fair.push(ticket("a", number), 0.0)
    assert [fair.pop(0.0) is not None for _ in range(4)] == [True, True, True, False]
    assert fair.in_flight == 3


def adapters_in_flight(fair: FairQueue, *adapters: int) -> list[Ticket]:
    """Put requests for ``adapters`` in the engine (tenant ``running``)."""
    held = []
    for number, adapter in enumerate(adapters):
        fair.push(ticket("running", number, adapter=adapter), 0.0)
        dispatch = fair.pop(0.0)
        assert dispatch is not None
        held.append(dispatch.waiting.ticket)
    return held


def test_a_request_whose_adapter_cannot_run_waits_here_while_others_go() -> None:
    """Every slot is busy with running adapters: vLLM could not run the request, so it waits
    in the gateway (where the fair order holds), not in vLLM's queue."""
    fair = queue(window=8, max_loras=2)
    running = adapters_in_flight(fair, 1, 2)  # both slots busy
    fair.push(ticket("x", 0, adapter=3), 0.0)  # would need a third slot
    fair.push(ticket("y", 0, adapter=2), 0.0)  # resident
    first = fair.pop(0.0)
    assert first is not None
    assert (first.waiting.ticket.tenant, first.reason) == ("y", "adapter_affinity")
    assert fair.pop(0.0) is None  # the window has room; adapter 3 has none
    fair.done(first.waiting.ticket, None)
    assert fair.pop(0.0) is None  # adapter 2 still runs a request
    fair.done(running[1], None)
    second = fair.pop(0.0)
    assert second is not None and second.waiting.ticket.tenant == "x"


def test_where_the_engine_shares_its_slots_a_request_that_crowds_them_goes_in_last() -> None:
    """The engine pauses a slot's requests for it (app.inside_vllm.slot_sharing): nothing
    waits here for a slot, but with a choice the resident adapters still go first."""
    fair = queue(window=4, max_loras=2, hold_crowding=False)
    adapters_in_flight(fair, 1, 2)  # both slots busy
    fair.push(ticket("x", 0, adapter=3), 0.0)  # would need a third slot
    fair.push(ticket("y", 0, adapter=2), 0.0)  # resident
    fair.push(ticket("z", 0, adapter=4), 0.0)  # would need a third slot too
    first, second = fair.pop(0.0), fair.pop(0.0)
    assert first is not None and second is not None
    assert [first.waiting.ticket.tenant, second.waiting.ticket.tenant] == ["y", "x"]
    assert fair.pop(0.0) is None  # the window, not a slot, holds z
    assert fair.affinity.draining is None and fair.affinity.reserved is None


def test_affinity_prefers_an_adapter_that_fits_to_one_that_crowds() -> None:
    fair = queue(window=8, max_loras=2)
    adapters_in_flight(fair, 1)  # one slot free
    fair.push(ticket("x", 0), 0.0)  # base model: resident
    fair.push(ticket("y", 0, adapter=5), 0.0)  # fits the free slot
    fair.push(ticket("z", 0, adapter=1), 0.0)  # resident
    tenants = [fair.pop(0.0) for _ in range(3)]
    assert [d.waiting.ticket.tenant for d in tenants if d] == ["x", "z", "y"]


def test_the_free_slot_goes_to_the_adapter_most_requests_wait_for() -> None:
    fair = queue(window=8, max_loras=2, quantum=3 * SMALL)
    adapters_in_flight(fair, 1)  # one slot free
    fair.push(ticket("few", 0, adapter=5), 0.0)
    for number in range(3):
        fair.push(ticket("many", number, adapter=6), 0.0)
    dispatched = [fair.pop(0.0) for _ in range(4)]
    assert [d.waiting.ticket.tenant if d else None for d in dispatched] == [
        "many", "many", "many", None  # adapter 5 would need a third slot
    ]  # fmt: skip
    assert dispatched[0] is not None and dispatched[0].reason == "adapter_affinity"


def test_affinity_never_overrides_a_fair_claim() -> None:
    """A tenant whose turn it is goes, even with a cold adapter: affinity only orders ties."""
    fair = queue(window=8, max_loras=2, quantum=SMALL)
    adapters_in_flight(fair, 1)
    fair.push(ticket("cold", 0, adapter=2), 0.0)
    # Costs four rounds of credit: not an equal claim with the cold request's one round.
    fair.push(ticket("warm", 0, adapter=1, cost=4 * SMALL), 0.0)
    first = fair.pop(0.0)
    assert first is not None
    assert (first.waiting.ticket.tenant, first.reason) == ("cold", "fair_share")


def test_a_request_held_past_the_age_bound_gets_a_slot_drained_for_it() -> None:
    fair = queue(window=8, max_loras=2, max_adapter_wait=2.0)
    running = adapters_in_flight(fair, 1, 2)
    fair.push(ticket("x", 0, adapter=3), 0.0)
    fair.push(ticket("y", 0, adapter=2), 0.5)
    early = fair.pop(1.0)
    assert early is not None and early.reason == "adapter_affinity"
    fair.done(early.waiting.ticket, None)
    # Past the bound, x's wait drains adapter 1 (the fewest requests in the engine): its
    # new requests wait, adapter 2's still go in.
    fair.push(ticket("z", 0, adapter=1), 2.0)
    fair.push(ticket("y", 1, adapter=2), 2.0)
    after = fair.pop(2.0)
    assert after is not None and after.waiting.ticket.tenant == "y"
    assert fair.pop(2.0) is None
    fair.done(running[0], None)  # adapter 1's slot is free
    late = fair.pop(2.5)
    assert late is not None
    assert (late.waiting.ticket.tenant, late.reason) == ("x", "age")
    assert fair.pop(2.5) is None  # now adapter 1 waits for a slot


def test_a_tenants_request_that_cannot_run_is_passed_by_its_next_ones_that_can() -> None:
    """One tenant, more adapters than slots: its requests for the running adapters go on
    while the one that needs a third slot waits (not the whole queue behind it)."""
    fair = queue(window=8, max_loras=2, quantum=10 * SMALL)
    for number, adapter in enumerate([1, 2, 3, 1, 2]):
        fair.push(ticket("a", number, adapter=adapter), float(number))
    dispatched = [fair.pop(5.0) for _ in range(5)]
    assert [d.waiting.ticket.request_id if d else None for d in dispatched] == [
        "a-0", "a-1", "a-3", "a-4", None
    ]  # fmt: skip
    assert [d.reason for d in dispatched[2:4] if d] == ["adapter_affinity"] * 2
    for d in dispatched[:2]:
        assert d is not None
        fair.done(d.waiting.ticket, None)
    assert fair.pop(5.0) is None  # adapters 1 and 2 still run a-3 and a-4
    assert dispatched[2] is not None
    fair.done(dispatched[2].waiting.ticket, None)
    last = fair.pop(5.0)
    assert last is not None and last.waiting.ticket.request_id == "a-2"


def test_the_slot_drained_past_the_age_bound_is_kept_for_the_old_request() -> None:
    """Even against a tenant whose claim comes first (a cheaper request): the freed slot is
    the old request's."""
    fair = queue(window=8, max_loras=2, max_adapter_wait=2.0)
    running = adapters_in_flight(fair, 1, 2)
    fair.push(ticket("old", 0, adapter=3, cost=4 * SMALL), 0.0)
    assert fair.pop(2.0) is None  # adapter 1 drains for adapter 3
    fair.done(running[0], None)
    fair.push(ticket("rich", 0, adapter=5), 2.0)
    first = fair.pop(2.5)
    assert first is not None
    assert (first.waiting.ticket.tenant, first.reason) == ("old", "age")
    assert fair.pop(2.5) is None  # adapters 2 and 3 hold both slots


def test_a_slot_kept_for_a_request_that_left_is_free_again() -> None:
    fair = queue(window=8, max_loras=2, max_adapter_wait=2.0)
    running = adapters_in_flight(fair, 1, 2)
    gone = fair.push(ticket("old", 0, adapter=3), 0.0)
    assert fair.pop(2.0) is None
    fair.remove(gone)
    fair.done(running[0], None)
    fair.push(ticket("new", 0, adapter=4), 3.0)
    after = fair.pop(3.0)
    assert after is not None and after.waiting.ticket.tenant == "new"


def test_a_tenant_held_back_for_its_adapter_gains_no_credit_meanwhile() -> None:
    """Once its adapter can run it shares from then on; it does not catch up on the time it
    could not run."""
    fair = queue(window=64, max_loras=1, quantum=SMALL, max_adapter_wait=1e9)
    (running,) = adapters_in_flight(fair, 1)
    for number in range(20):
        fair.push(ticket("cold", number, adapter=2), 0.0)
    for number in range(40):
        fair.push(ticket("warm", number, adapter=1), 0.0)
    assert Counter(d.waiting.ticket.tenant for d in drain(fair, 10)) == {"warm": 10}
    fair.done(running, None)
    assert Counter(d.waiting.ticket.tenant for d in drain(fair, 20)) == {"warm": 10, "cold": 10}


def constrained(tenant: str, number: int, *, adapter: int | None = None) -> Ticket:
    """A request with an output constraint (a grammar the engine builds as it decodes)."""
    return ticket(tenant, number, adapter=adapter, constrained=True)


def request_ids(dispatched: list[Dispatch | None]) -> list[str | None]:
    return [d.waiting.ticket.request_id if d else None for d in dispatched]


def test_a_tenants_second_constrained_request_waits_for_its_first() -> None:
    fair = queue(window=8)
    fair.push(constrained("a", 0), 0.0)
    fair.push(constrained("a", 1), 0.0)
    first = fair.pop(0.0)
    assert first is not None and first.waiting.ticket.request_id == "a-0"
    assert fair.pop(0.0) is None  # the window has room; the tenant's cap has none
    fair.done(first.waiting.ticket, None)
    second = fair.pop(0.0)
    assert second is not None and second.waiting.ticket.request_id == "a-1"


def test_a_tenants_unconstrained_request_passes_its_held_constrained_one() -> None:
    fair = queue(window=8, quantum=10 * SMALL)
    fair.push(constrained("a", 0), 0.0)
    fair.push(constrained("a", 1), 1.0)
    fair.push(ticket("a", 2), 2.0)
    dispatched = [fair.pop(3.0) for _ in range(3)]
    assert request_ids(dispatched) == ["a-0", "a-2", None]
    # Passing a request held for the cap reorders nothing for adapters.
    assert dispatched[1] is not None and dispatched[1].reason == "fair_share"


def test_an_unconstrained_request_that_comes_after_the_held_one_passes_it_at_once() -> None:
    """Nothing could dispatch at the last look; the new request can, without waiting for a
    request to end."""
    fair = queue(window=8)
    fair.push(constrained("a", 0), 0.0)
    fair.push(constrained("a", 1), 0.0)
    assert request_ids([fair.pop(0.0), fair.pop(0.0)]) == ["a-0", None]
    fair.push(ticket("a", 2), 1.0)
    assert request_ids([fair.pop(1.0), fair.pop(1.0)]) == ["a-2", None]


def test_another_tenants_constrained_request_is_not_held_by_the_first_tenants() -> None:
    fair = queue(window=8)
    fair.push(constrained("a", 0), 0.0)
    fair.push(constrained("a", 1), 0.0)
    assert request_ids([fair.pop(0.0), fair.pop(0.0)]) == ["a-0", None]
    fair.push(constrained("b", 0), 1.0)
    assert request_ids([fair.pop(1.0), fair.pop(1.0)]) == ["b-0", None]


def test_the_age_bound_does_not_let_a_held_constrained_request_through() -> None:
    """Held for its tenant's cap, a request waits for the tenant's running one however long
    it has waited, and no adapter's slot is drained for it meanwhile."""
    fair = queue(window=8, max_loras=2, max_adapter_wait=1.0)
    running = adapters_in_flight(fair, 1, 2)
    fair.push(constrained("a", 0, adapter=1), 0.0)
    fair.push(constrained("a", 1, adapter=3), 0.0)  # would need a third slot too
    first = fair.pop(0.0)
    assert first is not None and first.waiting.ticket.request_id == "a-0"
    fair.push(ticket("b", 0, adapter=2), 10.0)
    passing = fair.pop(10.0)  # adapter 2 was not drained for a-1
    assert passing is not None and passing.waiting.ticket.tenant == "b"
    fair.done(running[1], None)
    fair.done(passing.waiting.ticket, None)  # adapter 3 fits now
    assert fair.pop(20.0) is None
    fair.done(first.waiting.ticket, None)
    last = fair.pop(20.0)
    assert last is not None
    assert (last.waiting.ticket.request_id, last.reason) == ("a-1", "fair_share")


def test_a_cap_of_two_lets_two_constrained_requests_run() -> None:
    fair = queue(window=8, max_constrained=2)
    for number in range(3):
        fair.push(constrained("a", number), 0.0)
    assert request_ids([fair.pop(0.0) for _ in range(3)]) == ["a-0", "a-1", None]


def test_a_tenant_held_back_for_its_constrained_requests_gains_no_credit_meanwhile() -> None:
    """As one held back for its adapter: it shares from the time one of them can run."""
    fair = queue(window=64, quantum=SMALL)
    fair.push(constrained("capped", 0), 0.0)
    held = fair.pop(0.0)
    assert held is not None
    for number in range(1, 21):
        fair.push(constrained("capped", number), 0.0)
    for number in range(40):
        fair.push(ticket("free", number), 0.0)
    assert Counter(d.waiting.ticket.tenant for d in drain(fair, 10)) == {"free": 10}
    fair.done(held.waiting.ticket, None)
    served = Counter(d.waiting.ticket.tenant for d in drain(fair, 20))
    # Its visit still due in the pass under way, and no more: 15 to 5 with the credit of
    # the passes it sat out.
    assert served == {"capped": 11, "free": 9}


def test_headroom_keeps_the_last_slots_for_a_newcomer() -> None:
    """The window here is the engine's batch (3) and the headroom (1) beyond it
    (:func:`app.scheduling.admission_for`): a request let in beyond the batch is marked, so
    that the engine seats it at once."""
    fair = queue(window=4, headroom=1)
    for number in range(10):
        fair.push(ticket("flood", number), 0.0)
    held = []
    while (dispatch := fair.pop(0.0)) is not None:
        held.append(dispatch)
    # Alone, the flooder fills the batch, never the headroom.
    assert len(held) == 3
    assert not any(d.waiting.through_headroom for d in held)
    fair.push(ticket("new", 0), 1.0)
    newcomer = fair.pop(1.0)
    assert newcomer is not None and newcomer.waiting.ticket.tenant == "new"
    assert newcomer.waiting.through_headroom
    # Once a flood request ends, the next goes into the batch, not through the headroom.
    fair.done(held[0].waiting.ticket, None)
    fair.done(newcomer.waiting.ticket, None)
    refill = fair.pop(2.0)
    assert refill is not None and not refill.waiting.through_headroom


def test_without_headroom_a_newcomer_waits_for_the_flood() -> None:
    """The case headroom exists for: the window full of one tenant's long streams."""
    fair = queue(window=4, headroom=0)
    for number in range(10):
        fair.push(ticket("flood", number), 0.0)
    while fair.pop(0.0) is not None:
        pass
    fair.push(ticket("new", 0), 1.0)
    assert fair.pop(1.0) is None


def test_a_flooder_over_its_share_does_not_take_the_headroom_back() -> None:
    fair = queue(window=4, headroom=1)
    for number in range(10):
        fair.push(ticket("flood", number), 0.0)
    held = [fair.pop(0.0) for _ in range(3)]
    fair.push(ticket("new", 0), 1.0)
    newcomer = fair.pop(1.0)
    assert newcomer is not None
    fair.done(newcomer.waiting.ticket, None)
    # The newcomer left: the flooder (3 of 4, above its share) still may not take slot 4.
    assert fair.pop(2.0) is None
    first = held[0]
    assert first is not None
    fair.done(first.waiting.ticket, None)
    again = fair.pop(2.0)
    assert again is not None and again.waiting.ticket.tenant == "flood"


def test_a_request_that_used_less_than_its_worst_case_is_refunded() -> None:
    """Tokens settle to what was used: a tenant whose requests stop early is not charged
    for max_tokens it never got."""
    fair = queue()
    for number in range(100):
        fair.push(ticket("early", number, cost=4 * SMALL), 0.0)
        fair.push(ticket("full", number, cost=4 * SMALL), 0.0)
    served: Counter[str] = Counter()
    for _ in range(60):
        dispatch = fair.pop(0.0)
        assert dispatch is not None
        tenant = dispatch.waiting.ticket.tenant
        served[tenant] += 1
        fair.done(dispatch.waiting.ticket, SMALL if tenant == "early" else None)
    assert served["early"] > 2 * served["full"]


def test_a_removed_request_leaves_no_trace() -> None:
    fair = queue()
    fair.push(ticket("a", 0), 0.0)
    first = fair.pop(0.0)
    gone = fair.push(ticket("b", 0), 0.0)
    fair.remove(gone)
    assert fair.depth("b") == 0 and fair.waiting() == 0
    assert first is not None
    fair.done(first.waiting.ticket, None)
    assert fair.pop(0.0) is None and fair.in_flight == 0


def test_a_batch_tenant_does_not_take_the_headroom() -> None:
    fair = queue(window=4, headroom=1)
    for number in range(10):
        fair.push(ticket("flood", number), 0.0)
    while fair.pop(0.0) is not None:
        pass
    fair.push(Ticket("batch-0", "batch", 1, SMALL, interactive=False), 1.0)
    assert fair.pop(1.0) is None
    fair.push(ticket("new", 0), 1.0)
    newcomer = fair.pop(1.0)
    assert newcomer is not None and newcomer.waiting.ticket.tenant == "new"


def test_a_request_wider_than_the_share_still_runs_on_an_empty_engine() -> None:
    fair = queue(window=4, headroom=2)
    fair.push(Ticket("wide", "a", 1, SMALL, seqs=4), 0.0)
    dispatch = fair.pop(0.0)
    assert dispatch is not None and fair.in_flight == 4


def test_a_charge_forgotten_with_the_credit_is_not_refunded() -> None:
    """A request dispatched as its tenant's queue emptied was never charged for good (the
    credit resets); its unused tokens must not become credit against the other tenants."""
    fair = queue(quantum=1)
    long = Ticket("long", "a", 1, 3000)
    fair.push(long, 0.0)
    held = fair.pop(0.0)
    assert held is not None
    for number in range(12):
        fair.push(ticket("a", number, cost=40), 0.0)
        fair.push(ticket("b", number, weight=3, cost=40), 0.0)
    fair.done(long, 100)
    served = Counter(d.waiting.ticket.tenant for d in drain(fair, 12))
    assert served["b"] == 9


def test_affinity_reorders_visits_within_a_pass_but_never_skips_one() -> None:
    """Tenants whose adapters stay resident cannot keep out a cold tenant whose adapter fits:
    each pass visits every waiting tenant once, affinity only decides the order (no age bound
    needed)."""
    fair = queue(window=64, max_loras=3, quantum=SMALL, max_adapter_wait=1e9)
    adapters_in_flight(fair, 1, 2)  # held for the whole test: adapters 1 and 2 stay resident
    for number in range(40):
        # The cold tenant's adapters take turns in the third slot, each a load.
        fair.push(ticket("cold", number, adapter=3 + number % 2), 0.0)
        fair.push(ticket("warm1", number, adapter=1), 0.0)
        fair.push(ticket("warm2", number, adapter=2), 0.0)
    served = Counter(d.waiting.ticket.tenant for d in drain(fair, 30))
    assert served == {"warm1": 10, "warm2": 10, "cold": 10}
    # The cold tenant started waiting first, yet the warm ones go first in each pass.
    assert [d.waiting.ticket.tenant for d in drain(fair, 3)] == ["warm1", "warm2", "cold"]


def popped(fair: FairQueue) -> list[str]:
    """Tenants of the requests let in now, until the queue lets in no more."""
    out = []
    while (dispatch := fair.pop(0.0)) is not None:
        out.append(dispatch.waiting.ticket.tenant)
    return out


def paced_queue(per_step: int) -> FairQueue:
    fair = FairQueue(
        window=64, headroom=2, quantum=SMALL, max_adapter_wait=10.0, max_loras=2, per_step=per_step
    )
    fair.pace(True)
    return fair


def test_paced_a_burst_goes_in_a_few_requests_per_engine_step() -> None:
    fair = paced_queue(per_step=4)
    for number in range(12):
        fair.push(ticket("a", number), 0.0)
    for _ in range(3):
        assert popped(fair) == ["a"] * 4
        fair.new_step()
    assert fair.waiting() == 0


def test_paced_a_newcomers_first_request_still_goes_in_at_once() -> None:
    fair = paced_queue(per_step=2)
    for number in range(10):
        fair.push(ticket("a", number), 0.0)
    assert len(popped(fair)) == 2
    fair.push(ticket("b", 0), 0.0)
    fair.push(ticket("b", 1), 0.0)
    assert popped(fair) == ["b"]  # its second waits for the next step like the others'


def test_nothing_is_paced_without_step_reports_or_with_no_limit() -> None:
    fair = paced_queue(per_step=2)
    fair.pace(False)
    for number in range(10):
        fair.push(ticket("a", number), 0.0)
    assert len(popped(fair)) == 10
    unpaced = paced_queue(per_step=0)
    for number in range(10):
        unpaced.push(ticket("a", number), 0.0)
    assert len(popped(unpaced)) == 10


def batch_line(tenant: str, number: int, cost: int = SMALL) -> Ticket:
    return Ticket(
        f"{tenant}-line-{number}", f"{tenant}:batch", 1, cost, interactive=False, batch_line=True
    )


def batch_queue(window: int, *, share: float = 1.0, step_tokens: int = 0) -> FairQueue:
    return FairQueue(
        window=window,
        headroom=0,
        quantum=SMALL,
        max_adapter_wait=10.0,
        max_loras=2,
        batch_share=share,
        batch_step_tokens=step_tokens,
    )


def test_batch_lines_go_in_only_while_no_interactive_request_waits() -> None:
    fair = batch_queue(4)
    for number in range(6):
        fair.push(batch_line("a", number), 0.0)
    first = fair.pop(0.0)
    assert first is not None and first.waiting.ticket.batch_line
    # An interactive request waits (the window has room): no batch line passes it.
    fair.push(ticket("b", 0), 0.0)
    fair.push(ticket("b", 1), 0.0)
    dispatched = [fair.pop(0.0) for _ in range(3)]
    assert request_ids(dispatched) == ["b-0", "b-1", None]
    # In the engine without a first token, they still wait there (for its queue, a device
    # slot, their prompt's step): no line goes in over them.
    fair.started(dispatched[0].waiting.ticket)  # type: ignore[union-attr]
    assert fair.pop(0.0) is None
    fair.started(dispatched[1].waiting.ticket)  # type: ignore[union-attr]
    # Once none waits, the lines fill what is left of the window.
    assert request_ids([fair.pop(0.0)]) == ["a-line-1"]
    assert fair.pop(0.0) is None and fair.in_flight == 4


def test_an_interactive_request_that_ends_without_a_token_waits_no_more() -> None:
    fair = batch_queue(4)
    fair.push(ticket("b", 0), 0.0)
    interactive = fair.pop(0.0)
    assert interactive is not None
    fair.push(batch_line("a", 0), 0.0)
    assert fair.pop(0.0) is None
    fair.done(interactive.waiting.ticket, 0)  # failed or cancelled before its first token
    assert request_ids([fair.pop(0.0)]) == ["a-line-0"]


def test_batch_lines_hold_their_share_of_the_window_beside_interactive_requests() -> None:
    fair = batch_queue(8, share=0.5)
    fair.push(ticket("b", 0), 0.0)
    interactive = fair.pop(0.0)
    assert interactive is not None
    fair.started(interactive.waiting.ticket)
    for number in range(10):
        fair.push(batch_line("a", number), 0.0)
    lines = [fair.pop(0.0) for _ in range(5)]
    assert [d is not None for d in lines] == [True] * 4 + [False]
    assert fair.batch_in_flight == 4 and fair.batch_seats() == 4
    # The seats left are interactive requests' at once.
    fair.push(ticket("b", 1), 0.0)
    assert request_ids([fair.pop(0.0)]) == ["b-1"]
    # A line that ends frees its seat for the next line, once b-1 has its first token.
    assert lines[0] is not None
    fair.done(lines[0].waiting.ticket, None)
    assert fair.batch_in_flight == 3 and fair.pop(0.0) is None
    fair.started(Ticket("b-1", "b", 1, SMALL))
    assert request_ids([fair.pop(0.0)]) == ["a-line-4"]


def test_a_batch_fills_the_window_as_soon_as_no_interactive_request_runs_or_waits() -> None:
    fair = FairQueue(
        window=8,
        headroom=2,
        quantum=SMALL,
        max_adapter_wait=10.0,
        max_loras=2,
        batch_share=0.5,
    )
    for number in range(20):
        fair.push(batch_line("a", number), 0.0)
    # Nothing interactive: the window less its headroom, as any tenant alone.
    assert len(popped(fair)) == 6 and fair.batch_alone()
    # An interactive request arrives: the batch is held to its share from that moment, and
    # the request goes in at once (the headroom).
    fair.push(ticket("b", 0), 1.0)
    assert not fair.batch_alone()
    interactive = fair.pop(1.0)
    assert interactive is not None and not fair.batch_alone()
    fair.started(interactive.waiting.ticket)
    # Lines that end are not replaced until the batch is back to its share.
    for number in range(3):
        fair.done(batch_line("a", number), None)
    assert fair.batch_in_flight == 3 and fair.batch_seats() == 4
    assert request_ids([fair.pop(1.0), fair.pop(1.0)]) == ["a-line-6", None]
    # The interactive request ends: the window is the batch's again at once, with no wait.
    fair.done(interactive.waiting.ticket, None)
    assert fair.batch_alone()
    assert request_ids([fair.pop(1.0) for _ in range(3)]) == ["a-line-7", "a-line-8", None]
    assert fair.batch_in_flight == 6
    # One queued in the gateway (not yet in the engine) is enough to hold the lines back.
    fair.push(ticket("b", 1), 1.0)
    fair.done(batch_line("a", 3), None)
    assert not fair.batch_alone() and request_ids([fair.pop(1.0)]) == ["b-1"]


def stepped(fair: FairQueue, steps: int) -> list[str | None]:
    """The lines let in over ``steps`` engine steps, one pop after each step's report."""
    let_in = []
    for _ in range(steps):
        fair.new_step()
        let_in.append(request_ids([fair.pop(0.0)])[0])
    return let_in


def test_beside_interactive_requests_batch_lines_take_their_tokens_per_engine_step() -> None:
    fair = batch_queue(32, share=1.0, step_tokens=50)
    fair.pace(True)  # the engine reports its steps
    fair.push(ticket("b", 0), 0.0)
    interactive = fair.pop(0.0)
    assert interactive is not None
    fair.started(interactive.waiting.ticket)
    for number in range(10):
        fair.push(batch_line("a", number, cost=100), 0.0)
    # 50 tokens a step, 100 a line: one line every other step, however many seats are free.
    assert request_ids([fair.pop(0.0), fair.pop(0.0)]) == ["a-line-0", None]
    assert stepped(fair, 6) == [None, "a-line-1", None, "a-line-2", None, "a-line-3"]
    # Steps reported at once (the queue read the engine late) count, one step's worth kept.
    fair.new_step(10)
    assert request_ids([fair.pop(0.0), fair.pop(0.0)]) == ["a-line-4", None]
    # With no line in flight, one goes in whatever the tokens: the engine's steps go on.
    for number in range(5):
        fair.done(batch_line("a", number, cost=100), None)
    assert request_ids([fair.pop(0.0), fair.pop(0.0)]) == ["a-line-5", None]


def test_batch_lines_tokens_per_step_are_not_counted_alone_nor_without_step_reports() -> None:
    alone = batch_queue(8, step_tokens=50)
    alone.pace(True)
    for number in range(8):
        alone.push(batch_line("a", number, cost=100), 0.0)
    assert len(popped(alone)) == 8
    unreported = batch_queue(8, step_tokens=50)
    unreported.push(ticket("b", 0), 0.0)
    interactive = unreported.pop(0.0)
    assert interactive is not None
    unreported.started(interactive.waiting.ticket)
    for number in range(8):
        unreported.push(batch_line("a", number, cost=100), 0.0)
    assert len(popped(unreported)) == 7  # seats only: the window has 7 left
