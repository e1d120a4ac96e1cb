"""LoRA slots shared in turns: the plan on its own, then vLLM's real scheduler driven step by
step (no model: each step's sampled token is made up) with one slot and two adapters."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

from app.inside_vllm.objectives import HEADROOM_KEY, Objectives
from app.inside_vllm.slot_sharing import (
    KEEP_ENDING_KEY,
    NEW_REQUEST_LEAD,
    OBJECTIVES_KEY,
    QUANTUM_KEY,
    SCHEDULER_CLS,
    TURN_LEAD_STEPS,
    SlotSharingScheduler,
    engine_options,
    plan,
)
from app.metrics import HEADROOM_SEATS, SLOT_TURN_LEAD_STEPS, SLOT_TURNS
from bench.turn_sim import BLOCK, placeholder_scheduler


@dataclass
class Lora:
    lora_int_id: int


@dataclass
class Fake:
    request_id: str
    adapter: int | None
    num_output_tokens: int = 0
    arrival_time: float = 0.0
    status: RequestStatus = RequestStatus.WAITING
    max_tokens: int = 1000
    lora_request: Lora | None = field(init=False)

    def __post_init__(self) -> None:
        self.lora_request = Lora(self.adapter) if self.adapter is not None else None


def running(request_id: str, adapter: int | None, tokens: int) -> Fake:
    return Fake(request_id, adapter, tokens, status=RequestStatus.RUNNING)


def paused(request_id: str, adapter: int, tokens: int) -> Fake:
    return Fake(request_id, adapter, tokens, status=RequestStatus.PREEMPTED)


def takes(
    slots: list[Fake],
    waiting: list[Fake],
    *,
    max_loras: int,
    quantum: int = 4,
    turn_start: dict[str, int] | None = None,
    waiting_since: dict[str, float] | None = None,
    now: float = 100.0,
    keep_ending: bool = False,
    objectives: dict[str, Objectives] | None = None,
    first_token_at: dict[str, float] | None = None,
    step_seconds: float = 0.0,
    turn_seconds: float = 0.0,
    first_token_turns: bool = False,
) -> list[tuple[object, ...]]:
    """The plan's takes as (the waiting request, the running requests it pauses), by id; with
    ``first_token_turns``, and whether each is for a first token only."""
    planned = plan(
        slots,
        waiting,
        max_loras=max_loras,
        quantum=quantum,
        turn_start=turn_start or {},
        waiting_since=waiting_since or {},
        now=now,
        keep_ending=keep_ending,
        objectives=objectives,
        first_token_at=first_token_at,
        step_seconds=step_seconds,
        turn_seconds=turn_seconds,
        first_token_turns=first_token_turns,
    )
    return [
        (take.request.request_id, [r.request_id for r in take.paused])
        + ((take.first_token,) if first_token_turns else ())
        for take in planned
    ]


def test_a_free_slot_is_given_first_and_pauses_nothing() -> None:
    slots = [running("a1", 1, 50)]
    waiting = [Fake("w", 3), Fake("x", 4, arrival_time=1.0)]
    in_turn = {"a1": 49}
    assert takes(slots, waiting, max_loras=2, turn_start=in_turn) == [("w", [])]
    assert takes(slots, waiting, max_loras=3, turn_start=in_turn) == [("w", []), ("x", [])]
    assert takes([], waiting, max_loras=1) == [("w", [])]


def test_a_paused_request_takes_a_slot_once_each_of_its_requests_had_its_quantum() -> None:
    slots = [running("a1", 1, 3), running("b1", 2, 4)]
    assert takes(slots, [paused("p", 3, 5)], max_loras=2) == [("p", ["b1"])]
    # A resumed request's turn counts from where it was paused.
    assert takes(slots, [paused("p", 3, 5)], max_loras=2, turn_start={"b1": 1}) == []


def test_a_new_request_takes_a_slot_held_without_a_turn_after_one_token_of_each() -> None:
    slots = [running("a1", 1, 0), running("b1", 2, 1)]
    assert takes(slots, [Fake("w", 3)], max_loras=2) == [("w", ["b1"])]
    slots[1].num_output_tokens = 0
    assert takes(slots, [Fake("w", 3)], max_loras=2) == []


def test_a_turn_is_never_cut_short() -> None:
    """A slot a turn gave (or gave back) is held for the whole quantum, even against a
    request with no token yet."""
    slots = [running("a1", 1, 0), running("b1", 2, 9)]
    for turn_start, taken in [({"b1": 6}, []), ({"b1": 5}, [("w", ["b1"])])]:
        assert takes(slots, [Fake("w", 3)], max_loras=2, turn_start=turn_start) == taken


def test_kept_ending_an_adapter_whose_requests_end_within_a_turn_keeps_its_slot() -> None:
    """Its slot frees within a turn anyway: pausing it would cost two slot changes."""
    holder, in_turn = running("b1", 2, 5), {"a1": 7}  # a1 is in its turn
    slots, waiting = [running("a1", 1, 9), holder], [paused("p", 3, 5)]
    for max_tokens, kept in [(9, True), (10, False)]:  # 4 tokens left, then 5
        holder.max_tokens = max_tokens
        taken = takes(slots, waiting, max_loras=2, turn_start=in_turn, keep_ending=True)
        assert taken == ([] if kept else [("p", ["b1"])])
    holder.max_tokens = 9
    assert takes(slots, waiting, max_loras=2, turn_start=in_turn) == [("p", ["b1"])]  # default
    # The same against a request with no token yet, once the holder has generated one.
    ending = running("c1", 2, 1)
    ending.max_tokens = 5
    slots = [running("a1", 1, 0), ending]
    assert takes(slots, [Fake("w", 3)], max_loras=2, keep_ending=True) == []
    assert takes(slots, [Fake("w", 3)], max_loras=2) == [("w", ["c1"])]


def test_a_turn_pauses_no_more_requests_than_the_smallest_adapter_runs() -> None:
    """Unless the waiting adapter brings as many: while the smallest adapter is in its turn,
    a larger one keeps its slot."""
    slots = [running("a1", 1, 9), running("a2", 1, 9), running("b1", 2, 9)]
    in_turn = {"b1": 7}
    assert takes(slots, [Fake("w1", 3)], max_loras=2, turn_start=in_turn) == []
    two = [Fake("w1", 3), Fake("w2", 3)]
    assert takes(slots, two, max_loras=2, turn_start=in_turn) == [("w1", ["a1", "a2"])]
    # The smallest adapter is the one to pause, however many it runs.
    assert takes(slots[:2], [Fake("w1", 3)], max_loras=1) == [("w1", ["a1", "a2"])]


def test_a_paused_request_first_in_line_keeps_the_next_slot_from_new_ones() -> None:
    """Past the lead, a paused request goes first; while no turn is long enough for it, the
    new request behind it does not take the slot it will need."""
    since = {"p": 100.0 - NEW_REQUEST_LEAD - 1}
    waiting = [Fake("n", 3, arrival_time=100.0), paused("p", 2, 5)]
    assert takes([running("a1", 1, 2)], waiting, max_loras=1, waiting_since=since) == []


def test_the_adapter_with_the_fewest_requests_gives_its_slot_up_first() -> None:
    slots = [running("a1", 1, 9), running("a2", 1, 9), running("b1", 2, 5)]
    late = 90.0  # w1 has waited longer than w2 and w2b together
    waiting = [Fake("w1", 3), Fake("w2", 4, arrival_time=late), Fake("w2b", 4, arrival_time=late)]
    waiting.append(Fake("w3", 5, arrival_time=late))
    assert takes(slots, waiting, max_loras=2) == [("w1", ["b1"]), ("w2", ["a1", "a2"])]


def test_waiting_adapters_are_served_by_their_requests_waits_added_up() -> None:
    """One slot change serves every request of the adapter that gets it: the adapter that
    brings more goes first, until a lone request has waited as long as they have together."""
    slots = [running("a1", 1, 9)]
    for lone_since, first in [(80.0, "pair"), (70.0, "lone")]:
        waiting = [Fake("lone", 2, arrival_time=lone_since)]
        waiting += [Fake("pair", 3, arrival_time=88.0), Fake("pair2", 3, arrival_time=88.0)]
        # waits with the new request's lead: 25 or 35 s against 2 x 17 s
        ((taker, _),) = takes(slots, waiting, max_loras=1)
        assert taker == first


def test_base_model_requests_neither_hold_slots_nor_wait_for_them() -> None:
    slots = [running("base", None, 50), running("a1", 1, 50)]
    waiting = [Fake("base2", None), Fake("w", 2)]
    assert takes(slots, waiting, max_loras=2) == [("w", [])]
    assert takes(slots, waiting, max_loras=1) == [("w", ["a1"])]


def test_a_request_with_no_token_yet_comes_before_recently_paused_ones_only() -> None:
    waiting = [paused("p", 2, 5), Fake("n", 3, arrival_time=100.0)]
    for paused_at, first in [(99.0, "n"), (100.0 - NEW_REQUEST_LEAD - 0.1, "p")]:
        ((taker, _),) = takes(
            [running("a1", 1, 9)],
            waiting,
            max_loras=1,
            turn_start={"p": 5},
            waiting_since={"p": paused_at},
        )
        assert taker == first


def test_requests_not_ready_to_run_are_not_served_a_slot() -> None:
    waiting = [Fake("grammar", 2, status=RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR)]
    assert takes([running("a1", 1, 9)], waiting, max_loras=1) == []


# -- turns by objectives -------------------------------------------------------------------

STEP = 0.25  # the engine's measured step time, in seconds (binary fractions: exact sums)
INTERACTIVE = Objectives(interactive=True, ttft=2.0, tpot=0.5)
WAITING_LEFT = 4
BATCH = Objectives(interactive=False, ttft=2.0, tpot=0.5)


def by_objectives(
    slots: list[Fake],
    waiting: list[Fake],
    now: float,
    *,
    objectives: dict[str, Objectives] | None = None,
    max_loras: int = 1,
    **kwargs: object,
) -> list[tuple[object, ...]]:
    """The takes with every request interactive (unless ``objectives`` says otherwise),
    each running one's first token 10 s before ``now``, and each waiting one
    :data:`WAITING_LEFT` tokens from its end unless its ``max_tokens`` is set: a turn for it
    holds the slot a short time, and costs no stream its objective."""
    for request in waiting:
        if request.max_tokens == Fake.max_tokens:
            request.max_tokens = request.num_output_tokens + WAITING_LEFT
    every = {r.request_id: INTERACTIVE for r in (*slots, *waiting)} | (objectives or {})
    first = {r.request_id: now - 10.0 for r in slots}
    first |= kwargs.pop("first_token_at", {})  # type: ignore[arg-type]
    return takes(
        slots,
        waiting,
        max_loras=max_loras,
        now=now,
        objectives=every,
        first_token_at=first,
        step_seconds=STEP,
        **kwargs,  # type: ignore[arg-type]
    )


def test_no_turn_while_every_waiting_request_is_within_its_objective() -> None:
    """The quantum would have paused the stream; its objectives need no turn yet."""
    slots, waiting = [running("a1", 1, 40)], [Fake("w", 2, arrival_time=99.0)]  # due at 101
    assert takes(slots, waiting, max_loras=1) == [("w", ["a1"])]  # by the quantum
    lead = TURN_LEAD_STEPS * STEP
    assert by_objectives(slots, waiting, now=101.0 - lead - STEP) == []
    # Nor with every slot held, new requests and paused streams waiting, each short of the
    # turn's lead of its deadline, each holder past its quantum.
    now = 100.0
    slots = [running("a1", 1, 40), running("b1", 2, 40)]
    waiting = [
        Fake("new", 3, arrival_time=now - 2.0 + lead + STEP),  # first token due in lead + 1
        paused("p", 4, 20),  # its 21st token due at 90.0 + 20 x 0.5 = 100 + lead + 1 step
    ]
    first = {"p": 90.0 + lead + STEP}
    assert sorted(w for w, _ in takes(slots, waiting, max_loras=2, now=now)) == ["new", "p"]
    assert by_objectives(slots, waiting, now, max_loras=2, first_token_at=first) == []
    # A step later, both are within the lead: each takes a slot.
    later = by_objectives(slots, waiting, now + STEP, max_loras=2, first_token_at=first)
    assert sorted(w for w, _ in later) == ["new", "p"]


def test_a_turn_is_taken_before_a_waiting_request_would_miss_its_first_token() -> None:
    """Once its deadline is within the turn's lead at the measured pace, unless a slot frees
    by itself in time: the holder's tokens left and a step for the prompt."""
    holder, waiting = running("a1", 1, 40), [Fake("w", 2, arrival_time=99.0)]  # due at 101
    now = 101.0 - TURN_LEAD_STEPS * STEP
    assert by_objectives([holder], waiting, now=now) == [("w", ["a1"])]
    for left, turn in [(2, False), (3, True)]:  # now + (left + 1) steps: 101.0, then 101.25
        holder.max_tokens = holder.num_output_tokens + left
        assert bool(by_objectives([holder], waiting, now=now)) == turn
    # A paused stream is due by its TPOT objective: its next token, over its life so far.
    stream = paused("p", 2, 21)  # its 22nd token is due at 90.5 + 21 x 0.5 = 101
    first = {"p": 90.5}
    holder.max_tokens = 1000
    assert by_objectives([holder], [stream], now=now - STEP, first_token_at=first) == []
    assert by_objectives([holder], [stream], now=now, first_token_at=first) == [("p", ["a1"])]


def test_a_free_slot_is_taken_at_once_and_the_request_due_soonest_goes_first() -> None:
    waiting = [Fake("later", 2, arrival_time=99.5), Fake("sooner", 3, arrival_time=99.0)]
    assert by_objectives([], waiting, now=99.5) == [("sooner", [])]
    # Before a request with no objective that has waited longer.
    waiting.append(Fake("none", 4, arrival_time=50.0))
    objectives = {"none": Objectives(interactive=True)}
    taken = by_objectives([], waiting, now=99.5, max_loras=2, objectives=objectives)
    assert taken == [("sooner", []), ("later", [])]


def test_a_turn_pauses_the_streams_with_the_most_slack() -> None:
    """Each stream's slack: how long it could stop and its next token still keep its life's
    time per token within its objective."""
    slots = [running("a1", 1, 20), running("b1", 2, 20)]
    waiting = [Fake("w", 3, arrival_time=99.0)]
    now = 101.0 - TURN_LEAD_STEPS * STEP
    for a_first, paused_ in [(85.0, "b1"), (95.0, "a1")]:  # a1's 21st token due at 95 or 105
        first = {"a1": a_first, "b1": 90.0}  # b1's due at 100
        assert by_objectives(slots, waiting, now, max_loras=2, first_token_at=first) == [
            ("w", [paused_])
        ]


def test_a_stream_is_never_paused_again() -> None:
    """Paused once, a stream with a TPOT objective is not paused again, even back within it;
    never paused, it may be paused behind it, once. One without a TPOT objective has none to
    keep: the quantum's turns pause it again."""
    holder, waiting = running("a1", 1, 10), [Fake("w", 2, arrival_time=99.0)]
    now = 101.0 - TURN_LEAD_STEPS * STEP  # 100.25
    for first, was_paused, turn in [
        (96.0, True, False),  # its 11th token due at 101: within, but paused before
        (95.0, True, False),  # due at 100, a step from now: behind
        (95.0, False, True),
    ]:
        since = {"a1": 90.0} if was_paused else {}
        taken = by_objectives(
            [holder], waiting, now, first_token_at={"a1": first}, waiting_since=since
        )
        assert taken == ([("w", ["a1"])] if turn else [])
    no_tpot = {"a1": Objectives(interactive=True, ttft=2.0)}
    taken = by_objectives([holder], waiting, now, objectives=no_tpot, waiting_since={"a1": 90.0})
    assert taken == [("w", ["a1"])]


def test_a_paused_stream_behind_is_spared_for_one_with_less_slack_never_paused() -> None:
    """The turn's pause goes to the stream never paused, though it is further behind: the
    one paused before is not paused again."""
    slots = [running("a1", 1, 10), running("b1", 2, 10)]
    waiting = [Fake("w", 3, arrival_time=99.0)]
    now = 101.0 - TURN_LEAD_STEPS * STEP  # 100.25
    first = {"a1": 95.0, "b1": 94.0}  # 11th tokens due at 100 and 99: both behind, a1 less
    assert by_objectives(slots, waiting, now, max_loras=2, first_token_at=first) == [("w", ["a1"])]
    protected = {"a1": 90.0}  # a1 was paused before
    taken = by_objectives(
        slots, waiting, now, max_loras=2, first_token_at=first, waiting_since=protected
    )
    assert taken == [("w", ["b1"])]
    # Both paused before and behind: no turn; the request waits for a slot to free.
    both = {"a1": 90.0, "b1": 90.0}
    assert (
        by_objectives(slots, waiting, now, max_loras=2, first_token_at=first, waiting_since=both)
        == []
    )


def test_a_turn_that_breaks_objectives_is_taken_only_where_it_saves_more() -> None:
    """A stream paused until a slot frees by itself (here: the taker's 8 tokens and a step)
    may miss its TPOT objective at its last token; the turn is taken for one waiting request
    only where it costs no objective, and for two where it costs one."""
    now = 101.0 - TURN_LEAD_STEPS * STEP  # 100.25; w's first token is due at 101
    holder = running("a1", 1, 10)
    holder.max_tokens = 20  # its last token at 102.75 running on, at 105 paused until then
    for first, turn in [(96.0, True), (94.0, False)]:  # due by its TPOT at 105.5, at 103.5
        waiting = [Fake("w", 2, arrival_time=99.0, max_tokens=8)]
        taken = by_objectives([holder], waiting, now, first_token_at={"a1": first})
        assert taken == ([("w", ["a1"])] if turn else [])
    # Two requests of the adapter, each of which misses its first token waiting for a slot.
    waiting = [Fake(w, 2, arrival_time=99.0, max_tokens=8) for w in ("w", "w2")]
    taken = by_objectives([holder], waiting, now, first_token_at={"a1": 94.0})
    assert taken == [("w", ["a1"])]
    # One of them would miss it anyway: it saves one.
    waiting[1].arrival_time = 98.0
    assert by_objectives([holder], waiting, now, first_token_at={"a1": 94.0}) == []


def test_a_paused_stream_is_counted_to_wait_out_the_takers_run() -> None:
    """Not only until another slot frees: that slot goes to whoever is due first. Here b1's
    slot frees in 4 steps, too late for w's first token, and a1 could wait that long and keep
    its objective, but not the 9 steps of w's run: the turn would break one objective to save
    one, and is not taken."""
    now = 101.0 - TURN_LEAD_STEPS * STEP  # 100.25; w's first token is due at 101
    a1, b1 = running("a1", 1, 10), running("b1", 2, 10)
    a1.max_tokens, b1.max_tokens = 20, 13  # b1 ends in 3 tokens, then its slot frees
    # a1's last token due by its TPOT at 94.5 + 19 x 0.5 = 104: at 103.75 after 4 steps
    # paused, at 105 after 9. b1 was paused before and is behind: no turn pauses it.
    first = {"a1": 94.5, "b1": 94.0}
    waiting = [Fake("w", 3, arrival_time=99.0, max_tokens=8)]
    taken = by_objectives(
        [a1, b1], waiting, now, max_loras=2, first_token_at=first, waiting_since={"b1": 90.0}
    )
    assert taken == []
    first["a1"] = 95.5  # due at 105: it keeps its objective through w's run
    taken = by_objectives(
        [a1, b1], waiting, now, max_loras=2, first_token_at=first, waiting_since={"b1": 90.0}
    )
    assert taken == [("w", ["a1"])]


def test_a_turn_for_a_first_token_pauses_its_streams_a_step_only() -> None:
    """Where the paused streams can be parked, a new request's turn lasts until it has its
    first token: a stream that could not wait out the taker's run can wait a step. One that a
    step would break is paused only where the turn saves more."""
    now = 101.0 - TURN_LEAD_STEPS * STEP  # 100.25; w's first token is due at 101
    a1, b1 = running("a1", 1, 10), running("b1", 2, 10)
    a1.max_tokens, b1.max_tokens = 20, 13  # b1's slot frees in 4 steps: too late for w
    first = {"a1": 94.5, "b1": 94.0}  # a1's last token due at 104: at 103.75 after 4 steps
    since = {"b1": 90.0}  # b1 was paused before and is behind: no turn pauses it
    waiting = [Fake("w", 3, arrival_time=99.0, max_tokens=8)]
    kwargs = {"max_loras": 2, "first_token_at": first, "waiting_since": since}
    assert by_objectives([a1, b1], waiting, now, **kwargs) == []  # w's whole run breaks a1
    taken = by_objectives([a1, b1], waiting, now, first_token_turns=True, **kwargs)
    assert taken == [("w", ["a1"], True)]
    # a1 due at 102.75, at its last token running on: a step's pause breaks it, to save w.
    first["a1"] = 93.25
    assert by_objectives([a1, b1], waiting, now, first_token_turns=True, **kwargs) == []
    # Taken where it saves two first tokens.
    waiting.append(Fake("w2", 3, arrival_time=99.0, max_tokens=8))
    taken = by_objectives([a1, b1], waiting, now, first_token_turns=True, **kwargs)
    assert taken == [("w", ["a1"], True)]


def test_a_turn_for_a_first_token_pauses_a_stream_paused_before_once_back_within() -> None:
    """Back within its objective: its next token keeps its deadline after the step's pause.
    A turn for a whole run never pauses it again."""
    holder, waiting = running("a1", 1, 10), [Fake("w", 2, arrival_time=99.0)]
    holder.max_tokens = 13  # its slot frees in 4 steps: too late for w's first token only
    now = 101.0 - TURN_LEAD_STEPS * STEP  # 100.25
    since = {"a1": 90.0}  # paused before
    for first, turn in [(96.0, True), (95.5, False)]:  # its 11th token due at 101, at 100.5
        kwargs = {"first_token_at": {"a1": first}, "waiting_since": since}
        assert by_objectives([holder], waiting, now, **kwargs) == []
        taken = by_objectives([holder], waiting, now, first_token_turns=True, **kwargs)
        assert taken == ([("w", ["a1"], True)] if turn else [])


def test_a_turn_for_a_first_token_is_taken_where_its_stream_keeps_its_pace_after() -> None:
    """Given its first token, the new request is paused until a slot frees by itself: a turn
    for its first token alone is taken only where it still meets its TPOT objective then,
    else its turn is judged as a whole run's."""
    holder, waiting = running("a1", 1, 10), [Fake("w", 2, arrival_time=99.0)]  # due at 101
    now = 101.0 - TURN_LEAD_STEPS * STEP  # 100.25: w's first token at 100.5
    # w's 4 tokens by 102.0: its slot must come back by 102 - 3 x 0.25 = 101.25.
    for left, first_token in [(3, True), (4, False)]:  # a1's slot frees at 101.25, 101.5
        holder.max_tokens = holder.num_output_tokens + left
        taken = by_objectives([holder], waiting, now, first_token_turns=True)
        assert taken == [("w", ["a1"], first_token)]


def test_no_turn_for_a_request_past_saving_until_it_is_overdue() -> None:
    """A turn that would not bring its request's token in time (the step it is taken for
    lasts ``turn_seconds`` longer) is not taken: the request is due first, so the first slot
    to free is its own. Once it is late by its TTFT objective again, it takes turns anyway."""
    holder, waiting = running("a1", 1, 40), [Fake("w", 2, arrival_time=99.0)]  # due at 101
    now = 100.5  # a turn's token at 100.75, or at 101.25 with a step half a second longer
    assert by_objectives([holder], waiting, now) == [("w", ["a1"])]
    assert by_objectives([holder], waiting, now, turn_seconds=0.5) == []
    assert by_objectives([holder], waiting, 103.0, turn_seconds=0.5) == []
    assert by_objectives([holder], waiting, 103.25, turn_seconds=0.5) == [("w", ["a1"])]
    # A paused stream: its 25th and last token by 90.5 + 24 x 0.5 = 102.5, its 22nd due at 101.
    stream = paused("p", 2, 21)
    stream.max_tokens = 25
    first = {"p": 90.5}
    for now, turn_seconds, turn in [(101.5, 0.0, True), (101.5, 0.5, False)]:
        taken = by_objectives(
            [holder], [stream], now, first_token_at=first, turn_seconds=turn_seconds
        )
        assert taken == ([("p", ["a1"])] if turn else [])
    # Overdue once 10.5 s (its 21 tokens' allowance) past its deadline.
    for now, turn in [(111.5, False), (111.75, True)]:
        taken = by_objectives([holder], [stream], now, first_token_at=first, turn_seconds=0.5)
        assert taken == ([("p", ["a1"])] if turn else [])


def test_a_turns_lead_counts_what_turns_add_to_their_step() -> None:
    """Each turn in a step makes it ``turn_seconds`` longer: a turn is taken that much
    sooner, and the second in a step is judged with both turns' time."""
    holders = [running("a1", 1, 40), running("b1", 2, 40)]
    waiting = [Fake("w", 3, arrival_time=99.0), Fake("v", 4, arrival_time=99.0)]  # due at 101
    lead = TURN_LEAD_STEPS * STEP
    assert by_objectives(holders, waiting, 101.0 - lead - 0.25, max_loras=2) == []
    taken = by_objectives(holders, waiting, 101.0 - lead - 0.25, max_loras=2, turn_seconds=0.25)
    assert [w for w, _ in taken] == ["w", "v"]  # within the lead of 0.25 and of 0.5 more
    # At 100.5 a first turn's token comes at 101.0, a second's at 101.25: too late.
    taken = by_objectives(holders, waiting, 100.5, max_loras=2, turn_seconds=0.25)
    assert [w for w, _ in taken] == ["w"]


def test_a_paused_streams_turn_lasts_its_whole_run() -> None:
    """A stream's next token is not its first: its turn, where one is due, is a whole one; a
    free slot is a take, never a turn."""
    holder = running("a1", 1, 40)
    stream = paused("p", 2, 21)  # its 22nd token is due at 90.5 + 21 x 0.5 = 101
    now = 101.0 - TURN_LEAD_STEPS * STEP
    kwargs = {"first_token_at": {"p": 90.5}, "first_token_turns": True}
    assert by_objectives([holder], [stream], now, **kwargs) == [("p", ["a1"], False)]
    new = Fake("w", 2, arrival_time=99.0)
    assert by_objectives([], [new], now, first_token_turns=True) == [("w", [], False)]


def test_a_turn_waits_for_each_stream_to_generate_a_token_since_it_last_started() -> None:
    holder, waiting = running("a1", 1, 10), [Fake("w", 2, arrival_time=99.0)]
    now = 101.0 - TURN_LEAD_STEPS * STEP
    assert by_objectives([holder], waiting, now, turn_start={"a1": 10}) == []
    assert by_objectives([holder], waiting, now, turn_start={"a1": 9}) == [("w", ["a1"])]


def test_a_batch_request_never_pauses_an_interactive_stream() -> None:
    slots, waiting = [running("a1", 1, 40)], [Fake("w", 2, arrival_time=99.0)]
    now = 101.0 - TURN_LEAD_STEPS * STEP
    classes = [
        (BATCH, INTERACTIVE, False),
        (BATCH, BATCH, True),
        (INTERACTIVE, BATCH, True),
    ]
    for waiting_class, holder_class, turn in classes:
        objectives = {"w": waiting_class, "a1": holder_class}
        taken = by_objectives(slots, waiting, now, objectives=objectives)
        assert taken == ([("w", ["a1"])] if turn else [])
    # Nor by the quantum, for a batch request with no objective of its own.
    objectives = {"w": Objectives(interactive=False), "a1": INTERACTIVE}
    assert by_objectives(slots, waiting, now, objectives=objectives) == []


def test_a_batch_request_pauses_batch_streams_only_whatever_their_slack() -> None:
    """An adapter running one interactive stream among batch ones is not paused for a batch
    request, though its streams have the most slack; an interactive request takes the slot
    of the adapter running batch streams only, at once."""
    slots = [
        running("mixed-batch", 1, 20),
        running("mixed-interactive", 1, 20),
        running("b1", 2, 20),
        running("b2", 2, 20),
    ]
    now = 101.0 - TURN_LEAD_STEPS * STEP
    first = {"mixed-batch": 95.0, "mixed-interactive": 95.0, "b1": 90.0, "b2": 90.0}
    classes = {"mixed-batch": BATCH, "b1": BATCH, "b2": BATCH}  # mixed-interactive: interactive
    for waiting_class, paused_ in [
        (BATCH, ["b1", "b2"]),
        (INTERACTIVE, ["b1", "b2"]),
    ]:
        waiting = [Fake("w", 3, arrival_time=99.0), Fake("w2", 3, arrival_time=99.0)]
        objectives = classes | {"w": waiting_class, "w2": waiting_class}
        taken = by_objectives(
            slots, waiting, now, max_loras=2, objectives=objectives, first_token_at=first
        )
        assert taken == [("w", paused_)]


def test_a_batch_request_kept_from_a_turn_keeps_no_interactive_request_from_one() -> None:
    """By the quantum: the batch adapter has waited longest, but the only holder past its
    turn runs an interactive stream, so the interactive request behind it takes that slot
    instead of both waiting for a slot to free."""
    slots = [running("a1", 1, 40)]
    waiting = [Fake("batch", 2, arrival_time=10.0), Fake("interactive", 3, arrival_time=99.0)]
    only_classes = {
        "a1": Objectives(interactive=True),
        "batch": Objectives(interactive=False),
        "interactive": Objectives(interactive=True),
    }
    assert takes(slots, waiting, max_loras=1) == [("batch", ["a1"])]  # classes unknown
    assert takes(slots, waiting, max_loras=1, objectives=only_classes) == [("interactive", ["a1"])]
    # Where no holder has had its quantum, the next slot is still the batch request's.
    assert takes(slots, waiting, max_loras=1, objectives=only_classes, turn_start={"a1": 38}) == []


def test_a_slot_held_by_batch_requests_only_is_an_interactive_requests_at_once() -> None:
    """Whatever the quantum or the objectives: each batch stream has had a token since it
    last started, and the batch adapter runs more requests than the interactive one brings."""
    classes = {
        "b1": Objectives(interactive=False),
        "b2": Objectives(interactive=False),
        "i1": Objectives(interactive=True),
        "w": Objectives(interactive=True),
    }
    slots = [running("b1", 1, 1), running("b2", 1, 1), running("i1", 2, 1)]
    waiting = [Fake("w", 3, arrival_time=99.0)]
    for quantum in (16, 0):
        taken = takes(slots, waiting, max_loras=2, quantum=quantum, objectives=classes)
        assert taken == [("w", ["b1", "b2"])]
    # With objectives no turn is due yet, but a batch slot is not waited for.
    tight = classes | {"w": INTERACTIVE}
    assert by_objectives(slots, waiting, 99.0, max_loras=2, objectives=tight) == [
        ("w", ["b1", "b2"])
    ]
    # Not before each batch stream has a token since it last started (i1 is in its turn).
    started = {"b2": 1, "i1": 0}
    assert takes(slots, waiting, max_loras=2, objectives=classes, turn_start=started) == []
    # A batch request waiting gets no such turn.
    batch_waiting = classes | {"w": Objectives(interactive=False)}
    assert takes(slots, waiting, max_loras=2, objectives=batch_waiting) == []


def test_interactive_requests_are_served_a_slot_before_batch_ones() -> None:
    """The batch adapter has waited longer and brings more requests; the free slot is the
    interactive request's, and the batch ones wait for the next."""
    classes = {
        "b1": Objectives(interactive=False),
        "b2": Objectives(interactive=False),
        "i": Objectives(interactive=True),
        "a1": Objectives(interactive=True),
    }
    slots = [running("a1", 1, 1)]
    waiting = [
        Fake("b1", 2, arrival_time=10.0),
        Fake("b2", 2, arrival_time=10.0),
        Fake("i", 3, arrival_time=99.0),
    ]
    assert takes(slots, waiting, max_loras=2, quantum=0) == [("b1", [])]  # classes unknown
    assert takes(slots, waiting, max_loras=2, quantum=0, objectives=classes) == [("i", [])]


def test_requests_without_objectives_fall_back_to_the_quantum() -> None:
    """A quantum of 0 (objectives alone) gives them free slots only."""
    slots, waiting = [running("a1", 1, 40)], [Fake("w", 2, arrival_time=99.0)]
    objectives = {"w": Objectives(interactive=True)}  # its class, no objective
    assert by_objectives(slots, waiting, 99.0, objectives=objectives) == [("w", ["a1"])]
    assert by_objectives(slots, waiting, 99.0, objectives=objectives, quantum=0) == []
    assert by_objectives([], waiting, 99.0, objectives=objectives, quantum=0) == [("w", [])]
    # A stream with no objective gives its slot up after its quantum only.
    holder_objectives = {"a1": Objectives(interactive=True)}
    now = 101.0 - TURN_LEAD_STEPS * STEP
    for turn_start, turn in [({"a1": 37}, False), ({"a1": 36}, True)]:
        taken = by_objectives(
            slots, waiting, now, objectives=holder_objectives, turn_start=turn_start
        )
        assert taken == ([("w", ["a1"])] if turn else [])


def test_the_engine_options_name_the_scheduler_and_its_quantum() -> None:
    assert engine_options(0) == {}
    assert engine_options(8) == {
        "scheduler_cls": SCHEDULER_CLS,
        "additional_config": {QUANTUM_KEY: 8},
    }
    assert engine_options(8, keep_ending=True)["additional_config"] == {
        QUANTUM_KEY: 8,
        KEEP_ENDING_KEY: True,
    }
    # Objectives with no quantum: the scheduler, for the requests that carry objectives.
    assert engine_options(0, objectives=True) == {
        "scheduler_cls": SCHEDULER_CLS,
        "additional_config": {QUANTUM_KEY: 0, OBJECTIVES_KEY: True},
    }


# -- vLLM's scheduler --------------------------------------------------------------------

PROMPT = 40
ANSWER = 6


def scheduler(
    quantum: int,
    *,
    asynchronous: bool = False,
    keep_ending: bool = False,
    objectives: bool = False,
    seats: int = 8,
    blocks: int = 64,
) -> Scheduler:
    """The scheduler the engine core builds from :func:`engine_options`, with one LoRA slot,
    ``seats`` requests at once (``max_num_seqs``) and a KV cache of ``blocks`` placeholder
    blocks (nothing is computed)."""
    built = placeholder_scheduler(
        engine_options(quantum, keep_ending=keep_ending, objectives=objectives),
        max_loras=1,
        max_num_seqs=seats,
        blocks=blocks,
        max_model_len=512,
        max_num_batched_tokens=512,
        asynchronous=asynchronous,
    )
    assert isinstance(built, SlotSharingScheduler) == bool(quantum or objectives)
    assert isinstance(built, AsyncScheduler) == (asynchronous and bool(quantum or objectives))
    return built


def request(
    number: int,
    adapter: int,
    objectives: Objectives | None = None,
    *,
    tenant: str | None = None,
    headroom: bool = False,
) -> Request:
    """A request of ``tenant`` (its cache salt), let in through the front's headroom where
    ``headroom``."""
    init_none_hash(sha256)
    extra_args = objectives.extra_args() if objectives is not None else None
    if headroom:
        extra_args = {**(extra_args or {}), HEADROOM_KEY: 1}
    return Request(
        request_id=f"r{number}",
        prompt_token_ids=[number + 1] * PROMPT,
        sampling_params=SamplingParams(max_tokens=ANSWER, ignore_eos=True, extra_args=extra_args),
        pooling_params=None,
        lora_request=LoRARequest(f"adapter-{adapter}", adapter, "/unused"),
        arrival_time=time.time(),
        cache_salt=tenant,
        block_hasher=get_request_block_hasher(BLOCK, sha256),
    )


@dataclass
class Run:
    """Which requests each step scheduled and preempted, and each request's tokens."""

    steps: list[tuple[set[str], set[str]]] = field(default_factory=list)
    computed: list[dict[str, int]] = field(default_factory=list)  # tokens each step
    tokens: Counter[str] = field(default_factory=Counter)

    def first_step(self, request_id: str) -> int:
        return next(i for i, (ran, _) in enumerate(self.steps) if request_id in ran)

    def last_step(self, request_id: str) -> int:
        return max(i for i, (ran, _) in enumerate(self.steps) if request_id in ran)


def drive(sched: Scheduler, arrivals: dict[int, Request], *, steps: int | None = None) -> Run:
    """Steps until every request is done (or ``steps`` steps), each sampling one token for
    every request whose prompt (or recomputed tokens) it completes; ``arrivals``: requests
    added before a step."""
    run = Run()
    for step in range(steps or 100):
        if step in arrivals:
            sched.add_request(arrivals[step])
        if not sched.has_requests():
            return run
        output = sched.schedule()
        ran = set(output.num_scheduled_tokens)
        run.steps.append((ran, set(output.preempted_req_ids or ())))
        run.computed.append(dict(output.num_scheduled_tokens))
        ids = sorted(ran)
        result = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={rid: i for i, rid in enumerate(ids)},
            sampled_token_ids=[[7] for _ in ids],
        )
        for outputs in sched.update_from_output(output, result).values():
            for finished in outputs.outputs:
                run.tokens[finished.request_id] += len(finished.new_token_ids)
    if steps is None:
        raise AssertionError("the requests did not finish")
    return run


def test_the_scheduler_reads_its_rules_from_the_engine_options() -> None:
    for keep_ending in (False, True):
        sched = scheduler(2, keep_ending=keep_ending)
        assert isinstance(sched, SlotSharingScheduler)
        assert (sched.quantum, sched.keep_ending) == (2, keep_ending)


def test_vllm_alone_makes_the_second_adapter_wait_for_the_whole_first_answer() -> None:
    run = drive(scheduler(0), {0: request(0, 1), 1: request(1, 2)})
    assert run.first_step("r1") > run.last_step("r0")
    assert run.tokens == {"r0": ANSWER, "r1": ANSWER}


@pytest.mark.parametrize(
    ("asynchronous", "parked_kv_usage", "resumed_with"),
    [
        # Parked: r0 keeps its KV blocks and resumes with its next token alone.
        (False, 0.5, 1),
        # Parked, then preempted once r1's blocks fill the cache past the limit, and
        # preempted at once where vLLM schedules asynchronously: r0 resumes from the prefix
        # cache, its prompt's full block not computed again.
        (False, 0.05, PROMPT + 1 - BLOCK),
        (True, 0.5, PROMPT + 1 - BLOCK),
    ],
)
def test_the_slot_is_shared_in_turns_and_every_answer_is_whole(
    asynchronous: bool, parked_kv_usage: float, resumed_with: int
) -> None:
    sched = scheduler(2, asynchronous=asynchronous)
    assert isinstance(sched, SlotSharingScheduler)
    sched.parked_kv_usage = parked_kv_usage
    r0, r1 = request(0, 1), request(1, 2)
    turns = SLOT_TURNS.labels("quantum")._value.get()
    leads = lead_steps()
    run = drive(sched, {0: r0, 1: r1})
    taken = SLOT_TURNS.labels("quantum")._value.get() - turns
    assert taken >= 2  # turns, both ways
    # Each turn delivered its request's next token at the step it was taken in.
    count, total = (after - before for after, before in zip(lead_steps(), leads, strict=True))
    assert count == taken and total == taken
    # r1 has its first token the step after it came, once r0 had its first one: it takes
    # r0's slot. r0 resumes when r1 has had its turn of two tokens.
    assert run.steps[1] == ({"r1"}, {"r0"} if asynchronous else set())  # parked: not freed
    assert run.steps[3][0] == {"r0"}
    assert run.last_step("r0") > run.first_step("r1")
    assert run.computed[3]["r0"] == resumed_with
    # Each paused request resumed where it was: every token, once.
    assert run.tokens == {"r0": ANSWER, "r1": ANSWER}
    assert r0.num_preemptions >= 1 and r1.num_preemptions >= 1  # turns, both ways
    assert not sched.has_requests()
    assert sched._turn_start == {} and sched._waiting_since == {}  # forgotten once done
    assert sched._parked == [] and sched.kv_cache_manager.usage == 0.0


def lead_steps() -> tuple[float, float]:
    """The turn-lead histogram's count and sum so far, over its rules."""
    samples = SLOT_TURN_LEAD_STEPS.collect()[0].samples
    name = "lora_gateway_slot_turn_lead_steps"
    count = sum(s.value for s in samples if s.name == f"{name}_count")
    return count, sum(s.value for s in samples if s.name == f"{name}_sum")


@pytest.mark.parametrize(("quantum", "asynchronous"), [(0, False), (2, False), (0, True)])
@pytest.mark.parametrize(("ttft", "turn"), [(3600.0, False), (1e-6, True)])
def test_the_scheduler_takes_turns_by_the_objectives_its_requests_carry(
    quantum: int, asynchronous: bool, ttft: float, turn: bool
) -> None:
    """With or without a quantum, synchronous or not: the second adapter waits for the whole
    first answer while its first token's objective allows, and takes the slot (after the
    holder's first token) when it is due: for its first token only, where the holder can be
    parked, which then has the slot back the step after."""
    sched = scheduler(quantum, asynchronous=asynchronous, objectives=not quantum)
    assert isinstance(sched, SlotSharingScheduler)
    within = Objectives(interactive=True, ttft=3600.0, tpot=3600.0)
    r0, r1 = request(0, 1, within), request(1, 2, Objectives(interactive=True, ttft=ttft))
    rules = ("objective", "first_token", "quantum")
    turns = {rule: SLOT_TURNS.labels(rule)._value.get() for rule in rules}
    run = drive(sched, {0: r0, 1: r1})
    if turn:
        assert run.first_step("r1") == 1 and run.last_step("r0") > 1
        if not asynchronous:  # r1, with no TPOT objective, waits for a slot once it has its token
            assert run.steps[2][0] == {"r0"}
    else:
        assert run.first_step("r1") > run.last_step("r0")
    # r1's turn, by its objective: for its whole run where vLLM schedules asynchronously.
    taken = {rule: SLOT_TURNS.labels(rule)._value.get() - turns[rule] for rule in rules}
    assert taken["objective"] == int(turn and asynchronous)
    assert taken["first_token"] == int(turn and not asynchronous)
    if not quantum:  # r0 had its slot back when r1 ended, or r1 when r0 ended: a free slot
        assert taken["quantum"] == 0
    assert run.tokens == {"r0": ANSWER, "r1": ANSWER}
    assert sched.step_seconds > 0  # the measured pace
    assert sched._objectives == {} and sched._first_token_at == {}  # forgotten once done


def test_a_turn_for_a_first_token_gives_the_slot_back_the_step_after() -> None:
    """r1's first token is due at once: r0 is parked for the step that computes r1's prompt,
    then goes back, with its blocks, while r1 waits with its own for the slot to free (its
    TPOT objective allows it)."""
    sched = scheduler(0, objectives=True)
    within = Objectives(interactive=True, ttft=3600.0, tpot=3600.0)
    r0 = request(0, 1, within)
    r1 = request(1, 2, Objectives(interactive=True, ttft=1e-6, tpot=3600.0))
    turns = SLOT_TURNS.labels("first_token")._value.get()
    run = drive(sched, {0: r0, 1: r1})
    assert run.steps[1][0] == {"r1"} and run.steps[2][0] == {"r0"}
    assert run.computed[2]["r0"] == 1  # resumed with its next token alone
    resumed = next(i for i in range(2, len(run.steps)) if "r1" in run.steps[i][0])
    assert resumed == run.last_step("r0") + 1 and run.computed[resumed]["r1"] == 1
    assert SLOT_TURNS.labels("first_token")._value.get() - turns == 1
    assert run.tokens == {"r0": ANSWER, "r1": ANSWER}
    assert r0.num_preemptions == 1 and r1.num_preemptions == 1
    assert sched._first_token_turns == {} and sched._parked == []
    assert sched.kv_cache_manager.usage == 0.0


@pytest.mark.parametrize(
    ("holder_interactive", "waiting_interactive", "turn"),
    [(True, False, False), (True, True, True), (False, True, True), (False, False, True)],
)
def test_the_scheduler_reads_each_requests_class_even_with_no_objective(
    holder_interactive: bool, waiting_interactive: bool, turn: bool
) -> None:
    """The classes alone, as the gateway sends them where no objective is set: the quantum's
    turns, but never a batch request's that pauses an interactive stream."""
    sched = scheduler(2)
    r0 = request(0, 1, Objectives(interactive=holder_interactive))
    r1 = request(1, 2, Objectives(interactive=waiting_interactive))
    turns = SLOT_TURNS.labels("quantum")._value.get()
    run = drive(sched, {0: r0, 1: r1})
    if turn:
        assert run.first_step("r1") == 1 and run.last_step("r0") > 1
    else:
        assert run.first_step("r1") > run.last_step("r0")
    assert (SLOT_TURNS.labels("quantum")._value.get() > turns) == turn
    assert run.tokens == {"r0": ANSWER, "r1": ANSWER}
    assert sched._objectives == {}  # forgotten once done


def test_requests_without_objectives_keep_vllms_order_under_objectives_alone() -> None:
    sched = scheduler(0, objectives=True)
    run = drive(sched, {0: request(0, 1), 1: request(1, 2)})
    assert run.first_step("r1") > run.last_step("r0")
    assert sched._objectives == {}


def test_a_parked_request_keeps_the_engine_stepping_and_can_be_aborted() -> None:
    sched = scheduler(2)
    r0, r1 = request(0, 1), request(1, 2)
    run = drive(sched, {0: r0, 1: r1}, steps=2)
    assert run.steps[1][0] == {"r1"} and r0.status == RequestStatus.PREEMPTED
    assert sched.get_request_counts() == (1, 1) and sched.kv_cache_manager.usage > 0
    sched.finish_requests("r1", RequestStatus.FINISHED_ABORTED)
    assert sched.has_requests()  # r0, parked, is all that is left
    sched.finish_requests("r0", RequestStatus.FINISHED_ABORTED)
    assert sched.kv_cache_manager.usage == 0.0  # the parked blocks are freed
    sched.schedule()
    assert sched._parked == [] and not sched.has_unfinished_requests()


def test_a_request_let_out_whose_adapter_lost_its_slot_is_parked_again() -> None:
    """As when vLLM's batch was full the step its adapter held a slot: it waits for a slot
    parked, under the KV cache's limit, not in vLLM's queue with its blocks."""
    sched = scheduler(2)
    r0 = request(0, 1)
    drive(sched, {0: r0, 1: request(1, 2)}, steps=2)
    assert sched._parked == [r0]
    sched._parked.remove(r0)
    sched.kv_holding_waiting.add_request(r0)  # let out, but r1 holds the slot again
    sched.parked_kv_usage = 0.0
    output = sched.schedule()
    assert set(output.num_scheduled_tokens) == {"r1"}
    assert r0 in sched.waiting and r0.num_computed_tokens == 0  # parked, then its blocks freed


def test_resetting_the_prefix_cache_with_the_running_requests_frees_the_parked_ones() -> None:
    sched = scheduler(2)
    arrivals = {step: request(step, step + 1) for step in range(3)}  # a new adapter a step
    first = drive(sched, arrivals, steps=4)
    assert [r.request_id for r in sched._parked] == ["r0", "r1"]
    assert not sched.reset_prefix_cache()  # they hold their blocks, as running ones do
    assert sched.reset_prefix_cache(reset_running_requests=True)
    assert sched._parked == [] and sched.kv_cache_manager.usage == 0.0
    rest = drive(sched, {})
    assert first.tokens + rest.tokens == {"r0": ANSWER, "r1": ANSWER, "r2": ANSWER}


def test_only_first_come_first_served_queues_can_be_reordered() -> None:
    sched = scheduler(0)
    sched.scheduler_config.policy = "priority"
    with pytest.raises(ValueError, match="first come, first served"):
        SlotSharingScheduler(
            vllm_config=sched.vllm_config,
            kv_cache_config=sched.kv_cache_config,
            structured_output_manager=sched.structured_output_manager,
            block_size=BLOCK,
        )


# -- the headroom's seats ------------------------------------------------------------------


def seats_reclaimed() -> dict[str, float]:
    return {how: HEADROOM_SEATS.labels(how)._value.get() for how in ("parked", "preempted")}


@pytest.mark.parametrize("headroom", [True, False])
def test_a_request_through_the_headroom_takes_a_seat_of_the_tenant_running_the_most(
    headroom: bool,
) -> None:
    """Three seats, all taken: tenant a's two requests and b's one. c's request, let in
    through the front's headroom, runs at once in the seat of a's request with the most
    tokens left, which is parked and resumes, with its blocks, in the first seat to free;
    unmarked, it waits for that seat."""
    sched = scheduler(0, objectives=True, seats=3)
    a0, a1 = request(0, 1, tenant="a"), request(1, 1, tenant="a")
    b0, c0 = request(2, 1, tenant="b"), request(3, 1, tenant="c", headroom=headroom)
    before = seats_reclaimed()
    run = drive(sched, {0: a0, 1: a1, 2: b0, 3: c0})
    freed = run.last_step(a0.request_id) + 1
    if headroom:
        assert run.first_step(c0.request_id) == 3
        assert run.steps[3] == ({a0.request_id, b0.request_id, c0.request_id}, set())  # parked
        assert run.computed[freed][a1.request_id] == 1  # back first, with its blocks
    else:
        assert run.first_step(c0.request_id) == freed
    assert run.tokens == {f"r{n}": ANSWER for n in range(4)}
    reclaimed = {how: n - before[how] for how, n in seats_reclaimed().items()}
    assert reclaimed == {"parked": int(headroom), "preempted": 0}
    assert sched._unseated == [] and sched._headroom == {}
    assert sched.kv_cache_manager.usage == 0.0


def test_a_request_through_the_headroom_on_a_full_kv_cache_frees_the_blocks_of_one() -> None:
    """Seats to spare but blocks for two requests: c's request, let in through the
    headroom, waits one step as vLLM leaves it, then a's request is preempted, its blocks
    freed, and c's runs."""
    sched = scheduler(0, objectives=True, blocks=5)
    a0, a1 = request(0, 1, tenant="a"), request(1, 1, tenant="a")
    c0 = request(2, 1, tenant="c", headroom=True)
    before = seats_reclaimed()
    run = drive(sched, {0: a0, 1: a1, 2: c0})
    assert run.first_step(c0.request_id) == 3 and run.steps[3][1] == {a1.request_id}
    assert run.tokens == {f"r{n}": ANSWER for n in range(3)}
    reclaimed = {how: n - before[how] for how, n in seats_reclaimed().items()}
    assert reclaimed == {"parked": 0, "preempted": 1}


def test_a_seat_goes_to_a_batch_request_of_its_own_tenant_first_never_an_interactive_one() -> None:
    """Tenant a runs an interactive request and a batch line (its own batch); tenant b
    one. a's next interactive request, through the headroom, takes the line's seat, not b's
    request's nor a's own interactive one's."""
    interactive, batch = Objectives(interactive=True), Objectives(interactive=False)
    sched = scheduler(0, objectives=True, seats=3)
    arrivals = {
        0: request(0, 1, interactive, tenant="a"),
        1: request(1, 1, batch, tenant="a"),
        2: request(2, 1, interactive, tenant="b"),
        3: request(3, 1, interactive, tenant="a", headroom=True),
    }
    run = drive(sched, arrivals)
    assert run.first_step("r3") == 3 and run.steps[3][0] == {"r0", "r2", "r3"}
    assert run.tokens == {f"r{n}": ANSWER for n in range(4)}
