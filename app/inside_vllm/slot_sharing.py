"""vLLM's scheduler with its LoRA slots shared in turns: no request waits a whole run for one.

vLLM runs at most ``max_loras`` adapters per step. Its scheduler never takes a slot back from
a running request, so a request whose adapter holds no slot waits until every running request
of some resident adapter has finished: one whole run, seconds on a CPU, the TTFT cliff users of
multi-LoRA servers report when adapters outnumber slots. :class:`SlotSharingScheduler`, run in
the engine core (``scheduler_cls``), takes a slot back instead: the resident adapter's running
requests are paused (parked with their KV cache blocks, or preempted by vLLM, which frees the
blocks and computes the request again from its last full one), and the waiting request the
slot was taken for goes to the front of the queue. A turn lasts ``quantum`` tokens of
each of its holder's requests; a request with no token yet may take a slot held without a turn
once each of them has generated one. With ``keep_ending``, an adapter whose running requests
all end within a turn (by their ``max_tokens``) keeps its slot: pausing them would cost two
slot changes, now and when they resume, to save the waiting request at most a turn (more
output at saturation, longer waits where adapters far outnumber the slots). A slot is taken
from the adapter running the fewest requests, or from one running no more than the waiting
adapter brings, so that a turn pauses no more requests than it must. Waiting adapters are
served by how long their requests have waited in all, so that one slot change serves the
adapter that brings more of them first, and every request's wait grows until it is served. A
new request counts :data:`NEW_REQUEST_LEAD` seconds more, so a first token does not wait
behind every paused stream, and no paused stream waits for ever.

A request that carries objectives (:mod:`app.inside_vllm.objectives`) is served by them
instead of the quantum: its adapter takes a slot by a turn only when it would otherwise miss
its objective (its first token's, or a paused stream's next token's), judged from the engine's
measured step time, what a turn adds to its step (measured too) and the tokens the holders
have left, and never for a request that would miss it all the same (until it is overdue by
its objective again); the turn pauses the adapter whose streams have the most slack against
their own time-per-token objective, and is not taken where it would make more of them miss it
than it saves waiting requests; a stream once paused is not paused again, and a batch request
never pauses an interactive stream. A turn for a first token, where the new request would
still meet its TPOT objective paused after it, lasts until the new requests it was taken for
have theirs: they are then parked as paused streams, and the streams paused for them go back,
a step later, so that it costs them a step, and may pause a stream paused before that is back
within its objective. Interactive requests are served first, and take a slot that batch
requests alone hold at once, whatever the quantum or objectives. The rules and what they cost:
docs/scheduling.md, "Sharing the device slots".

The same scheduler seats the requests the fair front lets in through its headroom (for a
tenant below its share, beyond the batch its tenants fill): where the batch is full, a running
request of the tenant running the most gives its seat up, paused as a turn pauses, until a
seat frees; it then goes back before anything else waiting (docs/scheduling.md, "Headroom").
"""

from __future__ import annotations

import math
import sys
import time
from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, Protocol

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreEventType
from vllm.v1.request import Request, RequestStatus

from app.inside_vllm.objectives import Objectives, through_headroom
from app.metrics import HEADROOM_SEATS, SLOT_TURN_LEAD_STEPS, SLOT_TURNS

QUANTUM_KEY = "lora_gateway_slot_quantum_tokens"
KEEP_ENDING_KEY = "lora_gateway_slot_keep_ending"
# Runs the scheduler with no quantum, for the requests that carry objectives; with a quantum,
# it reads their objectives anyway.
OBJECTIVES_KEY = "lora_gateway_slot_objectives"
SCHEDULER_CLS = f"{__name__}.SlotSharingScheduler"
# How much sooner a request with no token yet is served than a paused one: a bound on how
# long new requests can keep a paused stream waiting.
NEW_REQUEST_LEAD = 5.0
# How full the KV cache may be for a paused request to keep its blocks (be parked).
PARKED_KV_USAGE = 0.5
# How many steps before a deadline a turn is taken: the step that changes the slot and delivers
# the token (lora_gateway_slot_turn_lead_steps measures it), and two of margin, since a step
# that computes a prompt takes longer than the decoding steps the pace averages, and the pace
# varies (docs/scheduling.md, "Judged on a grid").
TURN_LEAD_STEPS = 3
# How much each step's time moves the measured pace (an exponential moving average).
PACE_SMOOTHING = 0.2


def engine_options(
    quantum: int, *, keep_ending: bool = False, objectives: bool = False
) -> dict[str, Any]:
    """The engine arguments that share the slots every ``quantum`` tokens (0: vLLM's own
    scheduler, a waiting adapter waits for a slot to free), an adapter whose requests end
    within a turn keeping its slot with ``keep_ending``; with ``objectives``, the requests
    that carry objectives are served by them, whatever the quantum (0: the others wait for
    a slot to free)."""
    if quantum <= 0 and not objectives:
        return {}
    additional: dict[str, Any] = {QUANTUM_KEY: max(quantum, 0)}
    if keep_ending:
        additional[KEEP_ENDING_KEY] = True
    if objectives:
        additional[OBJECTIVES_KEY] = True
    return {"scheduler_cls": SCHEDULER_CLS, "additional_config": additional}


class Candidate(Protocol):
    """What the plan reads of a vLLM request."""

    request_id: str
    arrival_time: float
    status: RequestStatus
    max_tokens: int

    @property
    def num_output_tokens(self) -> int: ...

    @property
    def lora_request(self) -> Any: ...


class Take(NamedTuple):
    """A slot the plan gives: to ``request``, from the running requests of the adapter that
    holds it (``paused``; none for a free slot), for its whole run or, with ``first_token``,
    until its adapter's new requests have their first token."""

    request: Candidate
    paused: list[Candidate]
    first_token: bool = False


class Holder(NamedTuple):
    """A resident adapter, as the plan sees it."""

    turn: int  # tokens each of its running requests has generated since it last started
    by_turn: bool  # a turn gave it the slot (or gave it back): the turn is not cut short
    requests: list[Candidate]

    def ends_within(self, tokens: int) -> bool:
        """Every running request ends within ``tokens`` more (by its ``max_tokens``; it may
        end sooner): the slot frees by itself."""
        return bool(self.requests) and all(
            r.max_tokens - r.num_output_tokens <= tokens for r in self.requests
        )


# A slot no adapter holds: taken at once, pausing nothing.
FREE_SLOT = Holder(turn=sys.maxsize, by_turn=False, requests=[])


def adapter_of(request: Candidate) -> int | None:
    lora = request.lora_request
    return lora.lora_int_id if lora is not None and lora.lora_int_id > 0 else None


class Judge:
    """The requests' objectives against the engine's pace, as the plan weighs them: when each
    request's next token is due, how much slack a running stream has, and whether a waiting
    request would miss without a turn. Times are ``time.time()`` seconds, as vLLM's arrival
    times are."""

    def __init__(
        self,
        objectives: Mapping[str, Objectives],
        first_token_at: Mapping[str, float],
        paused: Mapping[str, float],
        now: float,
        step_seconds: float,
        turn_seconds: float = 0.0,
    ) -> None:
        self.objectives = objectives
        self.first_token_at = first_token_at
        self.paused = paused  # the requests a turn has paused (and not finished)
        self.now = now
        self.step = step_seconds
        self.turn_seconds = turn_seconds
        self.turns = 0  # the turns the plan has taken so far, all in the coming step

    @property
    def turn_delay(self) -> float:
        """How much longer than a step the next turn's taker waits for its token: the time
        each turn in the coming step adds to it (its adapter's activation, its prompt), this
        one's and those taken before it."""
        return (self.turns + 1) * self.turn_seconds

    def deadline(self, request: Candidate) -> float | None:
        """When ``request``'s next token is due to meet its objective: its first token by its
        arrival plus its TTFT objective; a later one by its first token's time plus its TPOT
        objective for each token after the first, counted over its life so far. None where it
        has no such objective."""
        objectives = self.objectives.get(request.request_id)
        if objectives is None:
            return None
        if request.num_output_tokens == 0:
            return None if objectives.ttft is None else request.arrival_time + objectives.ttft
        first = self.first_token_at.get(request.request_id)
        if objectives.tpot is None or first is None:
            return None
        return first + objectives.tpot * request.num_output_tokens

    def overdue(self, request: Candidate) -> bool:
        """Whether ``request`` is past its next token's deadline by as long again as its
        objective allows it (a first token: its TTFT objective; a stream's next: its TPOT
        objective for each token after the first): the bound on how late a request past
        saving waits for a slot to free by itself."""
        deadline = self.deadline(request)
        if deadline is None:
            return False
        if request.num_output_tokens == 0:
            since = request.arrival_time
        else:
            since = self.first_token_at[request.request_id]
        return self.now - deadline > deadline - since

    def slack(self, request: Candidate) -> float:
        """How long a running request could stop and still have its next token in time:
        infinite where it has no objective."""
        deadline = self.deadline(request)
        return math.inf if deadline is None else deadline - self.now - self.step

    def protected(self, request: Candidate) -> bool:
        """A stream with a TPOT objective that a turn has paused: not paused again. Its
        pause took slack it makes up only at full speed, and a paused stream waits longer
        than the turn's estimate where turns follow one another."""
        objectives = self.objectives.get(request.request_id)
        return (
            request.request_id in self.paused
            and objectives is not None
            and objectives.tpot is not None
        )

    def interactive(self, request: Candidate) -> bool:
        objectives = self.objectives.get(request.request_id)
        return objectives is not None and objectives.interactive

    def batch(self, request: Candidate) -> bool:
        objectives = self.objectives.get(request.request_id)
        return objectives is not None and not objectives.interactive

    def yields(self, holder: Holder) -> bool:
        """Whether ``holder`` gives its slot to an interactive request at once: it runs batch
        requests only, each of which has generated a token since it last started (every
        turn makes progress)."""
        return holder.turn >= 1 and all(self.batch(r) for r in holder.requests)

    def may_pause(
        self, holder: Holder, waiting: Candidate, *, for_seconds: float | None = None
    ) -> bool:
        """Whether a turn for ``waiting`` may pause ``holder``'s requests: none is an
        interactive one where ``waiting`` is a batch request, nor a protected stream; for a
        pause of ``for_seconds`` only (a first token's), a protected stream may be paused if
        its next token keeps its deadline all the same (it is back within its objective)."""
        objectives = self.objectives.get(waiting.request_id)
        batch = objectives is not None and not objectives.interactive
        return not any(
            (batch and self.interactive(r))
            or (self.protected(r) and (for_seconds is None or self.slack(r) < for_seconds))
            for r in holder.requests
        )

    def needs_turn(self, deadline: float, holders: Iterable[Holder]) -> bool:
        """A request due at ``deadline`` needs a turn now: it is within the turn's lead of
        its deadline (:data:`TURN_LEAD_STEPS` steps at the engine's pace, and the turn's
        :attr:`turn_delay`; sooner, the holders run on and a slot may free by itself), and
        waiting for a slot to free by itself (:meth:`frees_in`) would miss it."""
        if deadline - self.now > TURN_LEAD_STEPS * self.step + self.turn_delay:
            return False
        return self.now + self.frees_in(holders) > deadline

    def streams_after_first(self, request: Candidate, holders: Iterable[Holder]) -> bool:
        """Whether ``request``, given its first token by a turn for it alone and then paused
        until a slot frees by itself, still meets its TPOT objective at its last token."""
        objectives = self.objectives.get(request.request_id)
        if objectives is None or objectives.tpot is None:
            return True
        first = self.now + self.step + self.turn_delay
        last = self.now + self.frees_in(holders) + (request.max_tokens - 1) * self.step
        return last <= first + objectives.tpot * (request.max_tokens - 1)

    def frees_in(self, holders: Iterable[Holder]) -> float:
        """How long until a slot frees by itself and its taker has a token: the holder with
        the fewest tokens left generates them (by their ``max_tokens``; they may end
        sooner), then a step for the taker's prompt."""
        left = min(
            (max(r.max_tokens - r.num_output_tokens for r in h.requests) for h in holders),
            default=0,
        )
        return (left + 1) * self.step

    def misses(self, request: Candidate, wait: float) -> bool:
        """Whether ``request``, waiting ``wait`` more and then running at the engine's pace,
        misses its objective: a new request its first token's; a stream its TPOT objective
        at its last token (by its ``max_tokens``), over its whole life, as its client
        counts it."""
        if request.num_output_tokens == 0:
            deadline = self.deadline(request)
            return deadline is not None and self.now + wait + self.step > deadline
        objectives = self.objectives.get(request.request_id)
        first = self.first_token_at.get(request.request_id)
        if objectives is None or objectives.tpot is None or first is None:
            return False
        last = self.now + wait + (request.max_tokens - request.num_output_tokens) * self.step
        return last > first + objectives.tpot * (request.max_tokens - 1)

    def broken(self, requests: Iterable[Candidate], wait: float) -> int:
        """How many of ``requests`` a wait of ``wait`` makes miss an objective they would
        meet without it."""
        return sum(self.misses(r, wait) and not self.misses(r, 0.0) for r in requests)


def plan(
    running: Iterable[Candidate],
    waiting: Iterable[Candidate],
    *,
    max_loras: int,
    quantum: int,
    turn_start: Mapping[str, int],
    waiting_since: Mapping[str, float],
    now: float,
    keep_ending: bool = False,
    objectives: Mapping[str, Objectives] | None = None,
    first_token_at: Mapping[str, float] | None = None,
    step_seconds: float = 0.0,
    turn_seconds: float = 0.0,
    first_token_turns: bool = False,
) -> list[Take]:
    """The slots to give now (:class:`Take`): each to a waiting request whose adapter holds
    no slot, from the running requests of the resident adapter whose slot it takes (none for a
    free slot).

    Free slots go first. Waiting adapters are served by their requests' waits until
    ``now`` added up, a request with no token yet counted :data:`NEW_REQUEST_LEAD` seconds
    longer, until one finds no slot to take. A resident adapter gives its slot up once each
    of its running requests has generated ``quantum`` tokens since it last started
    (``turn_start``: its output count then, for a request a turn paused or started); to a
    request with no token yet, one token is enough unless the adapter holds its slot by a
    turn, which is never cut short. With ``keep_ending``, an adapter whose running requests
    all end within ``quantum`` tokens keeps its slot. The adapter with the fewest running
    requests goes first, then the one furthest into its turn; one running more requests than
    the smallest gives its slot up only to an adapter with as many waiting, so a turn pauses
    no more requests than it must (each stops generating for the turn). A ``quantum`` of 0
    gives free slots only.

    Requests with ``objectives`` (by request id) are served by them instead, before the
    others, the one due soonest first (:class:`Judge`; ``first_token_at``: each one's first
    token's time, ``step_seconds``: the engine's measured step time, ``turn_seconds``: what a
    turn adds to the step it is taken for): an adapter takes a free slot at once, and a held
    one only when its request would otherwise miss its next token's deadline and meets it with
    the turn (or is overdue: :meth:`Judge.overdue`), at the last steps that still meet it,
    from the adapter whose requests have the most slack, each of which has generated a token
    since it last started (a request with no objective: its quantum), unless the pause makes
    more of them miss their TPOT objective than it saves (:func:`_by_objectives`); with
    ``first_token_turns``, a turn for a request with no token yet that keeps its TPOT
    objective paused after its first (:meth:`Judge.streams_after_first`) pauses them only
    until its adapter's new requests have theirs, a step, and may pause a stream paused
    before whose next token keeps its deadline all the same; no other turn pauses a stream
    paused before that has a TPOT objective. No turn for a batch request pauses an
    interactive one. These rules apply to the quantum's turns too, and a request they alone
    keep from a turn does not keep the requests behind it from one.

    Interactive requests (by their class) are served before batch ones, and an adapter with
    one waiting takes at once a slot held by batch requests only, each of which has had a
    token since it last started, whatever the quantum, the objectives or the requests it
    pauses: batch work never holds a slot an interactive request waits for."""
    judge = Judge(
        objectives or {}, first_token_at or {}, waiting_since, now, step_seconds, turn_seconds
    )
    resident: dict[int, list[Candidate]] = {}
    for request in running:
        adapter = adapter_of(request)
        if adapter is not None:
            resident.setdefault(adapter, []).append(request)
    blocked: dict[int, tuple[float, Candidate]] = {}  # its longest-waiting request
    interactive: dict[int, tuple[float, Candidate]] = {}  # its longest-waiting interactive one
    due: dict[int, tuple[float, Candidate]] = {}  # its request due soonest, with an objective
    queued: defaultdict[int, list[Candidate]] = defaultdict(list)  # its requests ready to run
    waited: defaultdict[int, float] = defaultdict(float)
    for request in waiting:
        adapter = adapter_of(request)
        if adapter is None or adapter in resident:
            continue
        if request.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            continue
        queued[adapter].append(request)
        since = waiting_since.get(request.request_id, request.arrival_time)
        if request.num_output_tokens == 0:
            since -= NEW_REQUEST_LEAD
        waited[adapter] += now - since
        if adapter not in blocked or since < blocked[adapter][0]:
            blocked[adapter] = since, request
        if judge.interactive(request) and (
            adapter not in interactive or since < interactive[adapter][0]
        ):
            interactive[adapter] = since, request
        deadline = judge.deadline(request)
        if deadline is not None and (adapter not in due or deadline < due[adapter][0]):
            due[adapter] = deadline, request
    if not blocked:
        return []

    holders = sorted(
        (
            Holder(
                turn=min(r.num_output_tokens - turn_start.get(r.request_id, 0) for r in requests),
                by_turn=any(r.request_id in turn_start for r in requests),
                requests=requests,
            )
            for requests in resident.values()
        ),
        key=lambda holder: (len(holder.requests), -holder.turn),
    )
    smallest = len(holders[0].requests) if holders else 0
    holders[:0] = [FREE_SLOT] * (max_loras - len(resident))
    takes: list[Take] = []
    # Interactive requests first: a batch request never takes a slot one of them waits for.
    order = sorted(
        blocked,
        key=lambda a: (
            a not in interactive,
            *((0, due[a][0]) if a in due else (1, -waited[a])),
        ),
    )
    for adapter in order:
        largest = max(smallest, len(queued[adapter]))
        if adapter in interactive:
            # A slot that only batch requests hold is an interactive request's at once.
            yielding = next((h for h in holders if h is FREE_SLOT or judge.yields(h)), None)
            if yielding is not None:
                holders.remove(yielding)
                takes.append(Take(interactive[adapter][1], yielding.requests))
                continue
        first_token = False
        if adapter in due:
            deadline, request = due[adapter]
            first_token = (
                first_token_turns
                and request.num_output_tokens == 0
                and judge.streams_after_first(request, holders)
            )
            holder = _by_objectives(
                judge, request, deadline, holders, largest, quantum, queued[adapter], first_token
            )
            if holder is None:
                continue  # within its objective, or no stream may be paused for it
            first_token = first_token and holder is not FREE_SLOT
        else:
            request = blocked[adapter][1]
            new = request.num_output_tokens == 0
            turned = [
                h
                for h in holders
                if (
                    h is FREE_SLOT
                    or (
                        quantum > 0
                        and h.turn >= (1 if new and not h.by_turn else quantum)
                        and not (keep_ending and h.ends_within(quantum))
                    )
                )
                and len(h.requests) <= largest
            ]
            if not turned:
                break  # the next slot is this request's
            pausable = (h for h in turned if h is FREE_SLOT or judge.may_pause(h, request))
            holder = next(pausable, None)
            if holder is None:
                continue  # its turns pause no stream it may: another request may take them
        holders.remove(holder)
        takes.append(Take(request, holder.requests, first_token))
        judge.turns += holder is not FREE_SLOT
    return takes


def _by_objectives(
    judge: Judge,
    request: Candidate,
    deadline: float,
    holders: list[Holder],
    largest: int,
    quantum: int,
    queued: list[Candidate],
    first_token: bool = False,
) -> Holder | None:
    """The slot ``request`` (due at ``deadline``, its adapter's waiting requests ``queued``)
    takes: a free one, else, where it would miss its deadline waiting for one, the held one
    whose pause breaks the fewest objectives, then whose streams have the most slack, among
    those a turn may pause; None where it waits. A turn that breaks objectives (its streams,
    paused until ``queued`` have run to their end, or with ``first_token`` for the step that
    gives them their first token, would miss their TPOT objective at their last token) is
    taken only where it saves more (the adapter's waiting requests that would miss theirs
    waiting for a slot to free, and meet them now): one request is worth one, whichever
    objective it keeps."""
    if holders and holders[0] is FREE_SLOT:
        return FREE_SLOT
    if not judge.needs_turn(deadline, holders):
        return None
    if judge.misses(request, judge.turn_delay) and not judge.overdue(request):
        return None  # past saving: the first slot to free is its own (it is due first)
    # Paused for a first token, the streams wait a step. Paused for the taker's whole run,
    # they are counted to wait it out, not only until the first slot to free: a slot that
    # frees sooner goes to whichever waiting request is due first, and new requests near
    # their first token's deadline compete for it.
    pause = (
        judge.step
        if first_token
        else judge.frees_in([Holder(turn=0, by_turn=True, requests=queued)])
    )
    pausable = [
        h
        for h in holders
        if h.turn >= 1
        and len(h.requests) <= largest
        and judge.may_pause(h, request, for_seconds=pause if first_token else None)
        and (h.turn >= quantum or all(judge.deadline(r) is not None for r in h.requests))
    ]
    if not pausable:
        return None
    lost, holder = max(
        ((judge.broken(h.requests, pause), h) for h in pausable),
        key=lambda pair: (-pair[0], min(judge.slack(r) for r in pair[1].requests)),
    )
    if lost and judge.broken(queued, judge.frees_in(holders)) <= lost:
        return None
    return holder


class SlotSharingScheduler(Scheduler):
    """vLLM's scheduler; before each step it gives the slots :func:`plan` names. Where vLLM
    schedules asynchronously (on a GPU, by default) it is built as
    :class:`AsyncSlotSharingScheduler`, since one class name is all ``scheduler_cls`` takes.

    A request a turn pauses is *parked*: it keeps its KV cache blocks and waits out of vLLM's
    queues until its adapter holds a slot again, then resumes where it stopped, with nothing
    computed again. While the KV cache is half full or more (:data:`PARKED_KV_USAGE`), a
    paused request is preempted instead (vLLM's own preemption, which frees its blocks), and
    so are the parked ones, so that parked blocks never crowd out a running request."""

    # Synchronous scheduling only: asynchronously every running request has a token in
    # flight at each step, which vLLM's preemption alone knows how to deliver.
    parks = True

    def __new__(cls, vllm_config: Any, *args: Any, **kwargs: Any) -> SlotSharingScheduler:
        if cls is SlotSharingScheduler and vllm_config.scheduler_config.async_scheduling:
            cls = AsyncSlotSharingScheduler
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        additional = self.vllm_config.additional_config
        options = additional if isinstance(additional, dict) else {}
        self.quantum = int(options.get(QUANTUM_KEY, 0))
        self.keep_ending = bool(options.get(KEEP_ENDING_KEY, False))
        if self.policy != SchedulingPolicy.FCFS:
            raise ValueError("slot sharing orders vLLM's queue first come, first served")
        # For the requests whose turn a take started or paused, until they finish: their
        # output count when the turn started (or will start, for a paused one); for paused
        # ones, the time they began waiting again.
        self._turn_start: dict[str, int] = {}
        self._waiting_since: dict[str, float] = {}
        self._parked: list[Request] = []
        self.parked_kv_usage = PARKED_KV_USAGE
        # The requests that carry objectives, until they finish, and when each had its first
        # token; the engine's pace: its step time, from the first schedule() after a step's
        # update_from_output() to the end of the next one (where vLLM schedules
        # asynchronously, the next step is scheduled before the last one's output is in), so
        # idle time between requests is never counted.
        self._objectives: dict[str, Objectives] = {}
        self._first_token_at: dict[str, float] = {}
        self._step_began: float | None = None
        self.step_seconds = 0.0
        # What a turn adds to the step that takes it: what a step that starts an adapter (one
        # the step before did not run: its activation, its requests' prompts) takes over the
        # pace, shared by the adapters it starts, measured over every such step, a turn's or
        # not, so that the first turn is judged with it too.
        self.turn_seconds = 0.0
        self._adapters_run: set[int] = set()  # by the last step scheduled
        # By each step scheduled whose output is not in yet, in order (where vLLM schedules
        # asynchronously, the next step is scheduled before the last one's output is in).
        self._adapters_started: deque[int] = deque()
        # The steps a turn takes to deliver: each request a turn was taken for, until its next
        # token, with the steps done and its output count when it was taken.
        self._steps = 0
        self._turn_taken: dict[str, tuple[int, int, str]] = {}
        # The turns taken for first tokens, by the adapter they gave a slot to: the request
        # each was taken for and the requests it paused, parked until it ends.
        self._first_token_turns: dict[int | None, tuple[Candidate, list[Candidate]]] = {}
        # The requests let in through the front's headroom that have not run yet, and the
        # running requests paused to seat them, parked until a seat frees.
        self._headroom: dict[str, Request] = {}
        self._unseated: list[Request] = []
        # Those of them that could run at the last step (a seat and a slot were theirs).
        self._stalled: set[str] = set()

    def add_request(self, request: Request) -> None:
        # Read wherever the scheduler runs: a tenant's own objectives need no class's. A
        # request's class alone is kept too: a batch request never pauses an interactive one.
        if request.sampling_params is not None:
            extra_args = request.sampling_params.extra_args
            objectives = Objectives.of(extra_args)
            if objectives is not None:
                self._objectives[request.request_id] = objectives
            if through_headroom(extra_args):
                self._headroom[request.request_id] = request
        super().add_request(request)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self._step_began is None:
            self._step_began = time.monotonic()
        if self._turn_start or self._objectives or self._unseated:
            self._forget_finished()
        returning = self._end_first_token_turns() if self._first_token_turns else []
        shares = self.quantum > 0 or any(o.any for o in self._objectives.values())
        if self.lora_config is not None and shares and self._anyone_waits():
            self._share_slots(self.lora_config.max_loras, returning)
        if self._headroom or self._unseated:
            self._seat_headroom()
        output = super().schedule(*args, **kwargs)
        if self.lora_config is not None:
            self._count_adapters_started(output)
        return output

    def _count_adapters_started(self, output: Any) -> None:
        """Count the adapters the coming step runs that the last did not: what it takes over
        the pace is theirs (:attr:`turn_seconds`)."""
        adapters = {
            adapter
            for request_id in output.num_scheduled_tokens
            if request_id in self.requests
            and (adapter := adapter_of(self.requests[request_id])) is not None
        }
        self._adapters_started.append(len(adapters - self._adapters_run))
        self._adapters_run = adapters

    def update_from_output(self, *args: Any, **kwargs: Any) -> Any:
        outputs = super().update_from_output(*args, **kwargs)
        self._steps += 1
        for request_id, (taken_at, tokens, rule) in list(self._turn_taken.items()):
            request = self.requests.get(request_id)
            if request is None or request.num_output_tokens > tokens:
                del self._turn_taken[request_id]
                if request is not None:
                    SLOT_TURN_LEAD_STEPS.labels(rule).observe(self._steps - taken_at)
        if self._objectives:
            now = time.time()
            for request_id, objectives in self._objectives.items():
                # Only a TPOT objective counts from the first token.
                if objectives.tpot is None or request_id in self._first_token_at:
                    continue
                request = self.requests.get(request_id)
                if request is not None and request.num_output_tokens > 0:
                    self._first_token_at[request_id] = now
        started = self._adapters_started.popleft() if self._adapters_started else 0
        if self._step_began is not None:
            step = time.monotonic() - self._step_began
            self._step_began = None
            pace = self.step_seconds
            self.step_seconds = step if not pace else pace + PACE_SMOOTHING * (step - pace)
            if started and pace:
                cost = max(step - pace, 0.0) / started
                turn = self.turn_seconds
                self.turn_seconds = cost if not turn else turn + PACE_SMOOTHING * (cost - turn)
        return outputs

    def _anyone_waits(self) -> bool:
        return bool(self.waiting or self.kv_holding_waiting or self._parked)

    def get_request_counts(self) -> tuple[int, int]:
        # Parked requests wait too: the engine keeps stepping while any does.
        running, waiting = super().get_request_counts()
        return running, waiting + len(self._parked) + len(self._unseated)

    def reset_prefix_cache(
        self, reset_running_requests: bool = False, reset_connector: bool = False
    ) -> bool:
        # A parked request holds its blocks as a running one does: freed only with them.
        if reset_running_requests:
            self._repark(set())
            self._unpark(self._parked, keep_blocks=False)
            self._unpark(self._unseated, keep_blocks=False, parked=self._unseated)
        return super().reset_prefix_cache(reset_running_requests, reset_connector)

    def _seat_headroom(self) -> None:
        """Seat the requests let in through the front's headroom that wait: the requests
        paused for them before go back first into the seats they leave (with their blocks,
        to the queue vLLM drains first). Each that could run but for a seat takes one from
        the tenant running the most, paused until a seat frees; one vLLM left waiting a step
        though it had a seat and a slot wants KV blocks, and the request it takes the seat of
        is preempted, which frees them."""
        waiting = [r for r in self._headroom.values() if r.status == RequestStatus.WAITING]
        self._headroom = {r.request_id: r for r in waiting}
        if self._unseated and (
            not self.parks or self.kv_cache_manager.usage >= self.parked_kv_usage
        ):
            self._unpark(self._unseated, keep_blocks=False, parked=self._unseated)
        seats = self.max_num_active_reqs - len(self.running) - len(self.kv_holding_waiting)
        back = self._unseated[: max(0, seats - len(waiting))]
        if back:
            self._unpark(back, keep_blocks=True, parked=self._unseated)
            seats -= len(back)
        ready = [r for r in waiting if self._has_slot(r)]
        stalled, self._stalled = self._stalled, {r.request_id for r in ready}
        seats = max(seats, 0)
        takers = [r for r in ready[:seats] if r.request_id in stalled] + ready[seats:]
        timestamp = time.monotonic()
        park = self.parks and self.kv_cache_manager.usage < self.parked_kv_usage
        for taker in takers:
            victim = self._seat_to_reclaim(taker)
            if victim is None:
                break
            self.running.remove(victim)
            if park and taker.request_id not in stalled:
                self._park(victim, timestamp, into=self._unseated)
                HEADROOM_SEATS.labels("parked").inc()
            else:
                self._preempt_request(victim, timestamp)
                HEADROOM_SEATS.labels("preempted").inc()
        # A preempted request goes to the queue's front, as vLLM puts it: behind the
        # requests it was paused for.
        self._to_front(ready)

    def _has_slot(self, request: Request) -> bool:
        """Whether ``request``'s adapter may run now: the base model, a resident adapter, or
        a free device slot."""
        adapter = adapter_of(request)
        if adapter is None or self.lora_config is None:
            return True
        resident = {adapter_of(r) for r in self.running} - {None}
        return adapter in resident or len(resident) < self.lora_config.max_loras

    def _seat_to_reclaim(self, taker: Request) -> Request | None:
        """The running request that gives its seat to ``taker``: a batch request first (its
        tenant's own included), else one of the tenant running the most (its requests share a
        cache salt; never ``taker``'s); of those, one that has its first token (a pause
        before it delays a first token), the one with the most tokens left (a pause costs it
        the least per token); None where none runs."""
        running = Counter(r.cache_salt for r in self.running)

        def batch(request: Request) -> bool:
            objectives = self._objectives.get(request.request_id)
            return objectives is not None and not objectives.interactive

        candidates = (r for r in self.running if batch(r) or r.cache_salt != taker.cache_salt)
        return max(
            candidates,
            key=lambda r: (
                batch(r),
                running[r.cache_salt],
                r.num_output_tokens > 0,
                r.max_tokens - r.num_output_tokens,
            ),
            default=None,
        )

    def _to_front(self, requests: list[Request]) -> None:
        """Put ``requests`` at the front of vLLM's queue, in their order."""
        if requests:
            self.waiting.remove_requests(requests)
            self.waiting.prepend_requests(reversed(requests))

    def _end_first_token_turns(self) -> list[Request]:
        """End each turn taken for a first token whose requests have theirs: its adapter's
        running requests are parked, as paused streams, and the requests the turn paused go
        back with their blocks, to the queue vLLM drains first. Those going back, returned,
        hold their adapter's slot for this step's plan."""
        now = time.time()
        timestamp = time.monotonic()
        returning: list[Request] = []
        for adapter, (taker, paused) in list(self._first_token_turns.items()):
            takers = [r for r in self.running if adapter_of(r) == adapter]
            waits = taker.status == RequestStatus.WAITING and taker.num_output_tokens == 0
            if waits or any(r.num_output_tokens == 0 for r in takers):
                continue  # a prompt still computing: the turn lasts another step
            del self._first_token_turns[adapter]
            for request in takers:
                self.running.remove(request)
                self._park(request, timestamp, into=self._parked)
                self._turn_start[request.request_id] = request.num_output_tokens
                self._waiting_since[request.request_id] = now
            back = [r for r in self._parked if r in paused]
            self._unpark(back, keep_blocks=True)
            returning.extend(back)
        return returning

    def _share_slots(self, max_loras: int, returning: list[Request]) -> None:
        # The requests a first token's turn returns hold their adapter's slot, as running.
        running = [*self.running, *returning]
        self._repark({adapter_of(r) for r in running})
        if self._parked and self.kv_cache_manager.usage >= self.parked_kv_usage:
            self._unpark(self._parked, keep_blocks=False)
        held = [*self._parked, *self.kv_holding_waiting]
        now = time.time()  # vLLM's arrival times are the front end's time.time()
        park = self.parks and self.kv_cache_manager.usage < self.parked_kv_usage
        takes = plan(
            running,
            [*held, *self.waiting],
            max_loras=max_loras,
            quantum=self.quantum,
            turn_start=self._turn_start,
            waiting_since=self._waiting_since,
            now=now,
            keep_ending=self.keep_ending,
            objectives=self._objectives,
            first_token_at=self._first_token_at,
            step_seconds=self.step_seconds,
            turn_seconds=self.turn_seconds,
            # A first token's turn parks the requests it pauses: it gives them their slot back.
            first_token_turns=park,
        )
        if not takes and not self._parked:
            return
        timestamp = time.monotonic()
        preempted: list[Request] = []
        for request, victims, first_token in takes:
            if first_token:
                self._first_token_turns[adapter_of(request)] = (request, victims)
            if victims:  # a turn, not a free slot
                rule = "first_token" if first_token else self._rule_of(request)
                self._turn_start[request.request_id] = request.num_output_tokens
                self._turn_taken[request.request_id] = (
                    self._steps,
                    request.num_output_tokens,
                    rule,
                )
                SLOT_TURNS.labels(rule).inc()
            for victim in victims:
                self.running.remove(victim)  # type: ignore[arg-type]
                if park:
                    self._park(victim, timestamp, into=self._parked)  # type: ignore[arg-type]
                else:
                    self._preempt_request(victim, timestamp)  # type: ignore[arg-type]
                    preempted.append(victim)  # type: ignore[arg-type]
                self._turn_start[victim.request_id] = victim.num_output_tokens
                if not first_token:  # a step's pause: not a pause that protects it
                    self._waiting_since[victim.request_id] = now
        # A parked request resumes once its adapter holds a slot: a resident adapter, or one
        # given a slot now. Those holding KV blocks go first in vLLM's order.
        wanted: list[Request] = [take.request for take in takes]  # type: ignore[misc]
        slotted = {adapter_of(r) for r in (*self.running, *returning, *wanted)}
        self._unpark([r for r in self._parked if adapter_of(r) in slotted], keep_blocks=True)
        # vLLM puts a preempted request at the queue's front: these go to its back, and the
        # waiting requests given a slot to its front, in the plan's order.
        queued = [r for r in wanted if r not in held]
        if not preempted and not queued:
            return  # removing none would still rebuild vLLM's whole queue
        self.waiting.remove_requests([*preempted, *queued])
        for victim in preempted:
            self.waiting.add_request(victim)
        self.waiting.prepend_requests(reversed(queued))  # extendleft: the last goes first

    def _rule_of(self, request: Candidate) -> str:
        """The rule a turn was taken by: its request's objective, where it has the one its
        next token is due by, else the quantum."""
        objectives = self._objectives.get(request.request_id)
        if objectives is None:
            return "quantum"
        first = request.num_output_tokens == 0
        return "objective" if (objectives.ttft if first else objectives.tpot) else "quantum"

    def _park(self, request: Request, timestamp: float, *, into: list[Request]) -> None:
        """Pause a running request with its KV blocks kept (``_preempt_request`` frees them
        and computes the request again from its last full block), in ``into``."""
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        if self.log_stats:
            request.record_event(EngineCoreEventType.PREEMPTED, timestamp)
        into.append(request)

    def _repark(self, slotted: set[int | None]) -> None:
        """Park again the requests let out to vLLM whose adapter is not in ``slotted``: let
        out, their adapter lost its slot before vLLM ran them (its batch was full). Parked,
        they wait for a slot, and give their blocks up past the KV cache's limit, as the
        other parked ones do."""
        back = [
            r
            for r in self.kv_holding_waiting
            if r.status == RequestStatus.PREEMPTED and adapter_of(r) not in slotted
        ]
        if back:
            self.kv_holding_waiting.remove_requests(back)
            self._parked.extend(back)

    def _unpark(
        self, requests: list[Request], *, keep_blocks: bool, parked: list[Request] | None = None
    ) -> None:
        """Back to vLLM's queues from ``parked`` (the turns' parked requests by default):
        with their blocks to the queue vLLM drains first (they resume with their next
        token), or with their blocks freed to the back of the queue, as a preempted request
        would be."""
        parked = self._parked if parked is None else parked
        for request in list(requests):
            parked.remove(request)
            if keep_blocks:
                self.kv_holding_waiting.add_request(request)
                continue
            self._free_request_blocks(request)
            request.num_computed_tokens = 0
            self.reset_preempted_req_ids.add(request.request_id)
            self.waiting.add_request(request)

    def _forget_finished(self) -> None:
        self._parked = [r for r in self._parked if not r.is_finished()]
        self._unseated = [r for r in self._unseated if not r.is_finished()]
        for request_id in [r for r in self._turn_start if r not in self.requests]:
            del self._turn_start[request_id]
            self._waiting_since.pop(request_id, None)
        for request_id in [r for r in self._objectives if r not in self.requests]:
            del self._objectives[request_id]
            self._first_token_at.pop(request_id, None)


class AsyncSlotSharingScheduler(SlotSharingScheduler, AsyncScheduler):
    """The same over vLLM's asynchronous scheduler (vLLM's preemption keeps its in-flight
    output apart), without parking."""

    parks = False
