"""vLLM's scheduler with its LoRA slots shared in turns: no request waits a whole run for one.

vLLM runs at most ``max_loras`` adapters per step. Its scheduler never takes a slot back from
a running request, so a request whose adapter holds no slot waits until every running request
of some resident adapter has finished: one whole run, seconds on a CPU, the TTFT cliff users of
multi-LoRA servers report when adapters outnumber slots. :class:`SlotSharingScheduler`, run in
the engine core (``scheduler_cls``), takes a slot back instead: the resident adapter's running
requests are preempted (vLLM's own preemption: their tokens so far are kept, their KV cache
blocks stay in the prefix cache for the resume) and go to the back of the queue, and the
waiting request the slot was taken for goes to its front. A turn lasts ``quantum`` tokens of
each of its holder's requests; a request with no token yet may take a slot held without a turn
once each of them has generated one. A slot is taken from the adapter running the fewest
requests, or from one running no more than the waiting adapter brings, so that a turn pauses
no more requests than it must. New requests come before paused ones that began waiting up to
:data:`NEW_REQUEST_LEAD` seconds before them, so a first token does not wait behind every
paused stream, and no paused stream waits for ever. The rules and what they cost:
docs/scheduling.md, "Sharing the device slots".
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, Protocol

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

QUANTUM_KEY = "lora_gateway_slot_quantum_tokens"
SCHEDULER_CLS = f"{__name__}.SlotSharingScheduler"
# How much sooner a request with no token yet is served than a paused one: a bound on how
# long new requests can keep a paused stream waiting.
NEW_REQUEST_LEAD = 5.0


def engine_options(quantum: int) -> dict[str, Any]:
    """The engine arguments that share the slots every ``quantum`` tokens (0: vLLM's own
    scheduler, a waiting adapter waits for a slot to free)."""
    if quantum <= 0:
        return {}
    return {"scheduler_cls": SCHEDULER_CLS, "additional_config": {QUANTUM_KEY: quantum}}


class Candidate(Protocol):
    """What the plan reads of a vLLM request."""

    request_id: str
    arrival_time: float
    status: RequestStatus

    @property
    def num_output_tokens(self) -> int: ...

    @property
    def lora_request(self) -> Any: ...


class Holder(NamedTuple):
    """A resident adapter, as the plan sees it."""

    turn: int  # tokens each of its running requests has generated since it last started
    by_turn: bool  # a turn gave it the slot (or gave it back): the turn is not cut short
    requests: list[Candidate]


def adapter_of(request: Candidate) -> int | None:
    lora = request.lora_request
    return lora.lora_int_id if lora is not None and lora.lora_int_id > 0 else None


def plan(
    running: Iterable[Candidate],
    waiting: Iterable[Candidate],
    *,
    max_loras: int,
    quantum: int,
    turn_start: Mapping[str, int],
    waiting_since: Mapping[str, float],
) -> list[tuple[Candidate, list[Candidate]]]:
    """The slots to take back now: pairs of (a waiting request whose adapter holds no slot,
    the running requests of the resident adapter whose slot it takes).

    Only when every slot is held. Waiting adapters are served in the order of their best
    request's wait, a request with no token yet counted :data:`NEW_REQUEST_LEAD` seconds
    longer, until one finds no slot to take. A resident adapter gives its slot up once each
    of its running requests has generated ``quantum`` tokens since it last started
    (``turn_start``: its output count then, for a request a turn paused or started); to a
    request with no token yet, one token is enough unless the adapter holds its slot by a
    turn, which is never cut short. The adapter with the fewest running requests goes first,
    then the one furthest into its turn; one running more requests than the smallest gives
    its slot up only to an adapter with as many waiting, so a turn pauses no more requests
    than it must (each is computed again from its last full KV block)."""
    resident: dict[int, list[Candidate]] = {}
    for request in running:
        adapter = adapter_of(request)
        if adapter is not None:
            resident.setdefault(adapter, []).append(request)
    if len(resident) < max_loras:
        return []
    blocked: dict[int, tuple[float, Candidate]] = {}
    ready: Counter[int] = Counter()
    for request in waiting:
        adapter = adapter_of(request)
        if adapter is None or adapter in resident:
            continue
        if request.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            continue
        ready[adapter] += 1
        since = waiting_since.get(request.request_id, request.arrival_time)
        if request.num_output_tokens == 0:
            since -= NEW_REQUEST_LEAD
        if adapter not in blocked or since < blocked[adapter][0]:
            blocked[adapter] = since, request
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
    smallest = len(holders[0].requests)
    takes: list[tuple[Candidate, list[Candidate]]] = []
    for adapter, (_, request) in sorted(blocked.items(), key=lambda item: item[1][0]):
        new = request.num_output_tokens == 0
        largest = max(smallest, ready[adapter])
        holder = next(
            (
                h
                for h in holders
                if h.turn >= (1 if new and not h.by_turn else quantum)
                and len(h.requests) <= largest
            ),
            None,
        )
        if holder is None:
            break  # the next slot is this request's
        holders.remove(holder)
        takes.append((request, holder.requests))
    return takes


class SlotSharingScheduler(Scheduler):
    """vLLM's scheduler; before each step it takes back the slots :func:`plan` names. Where
    vLLM schedules asynchronously (on a GPU, by default) it is built as
    :class:`AsyncSlotSharingScheduler`, since one class name is all ``scheduler_cls`` takes."""

    def __new__(cls, vllm_config: Any, *args: Any, **kwargs: Any) -> SlotSharingScheduler:
        if cls is SlotSharingScheduler and vllm_config.scheduler_config.async_scheduling:
            cls = AsyncSlotSharingScheduler
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        additional = self.vllm_config.additional_config
        self.quantum = int(additional.get(QUANTUM_KEY, 0)) if isinstance(additional, dict) else 0
        if self.policy != SchedulingPolicy.FCFS:
            raise ValueError("slot sharing orders vLLM's queue first come, first served")
        # For the requests whose turn a take started or paused, until they finish: their
        # output count when the turn started (or will start, for a paused one); for paused
        # ones, the time they began waiting again.
        self._turn_start: dict[str, int] = {}
        self._waiting_since: dict[str, float] = {}

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self._turn_start:
            self._forget_finished()
        if self.lora_config is not None and self.quantum > 0 and self.waiting:
            self._share_slots(self.lora_config.max_loras)
        return super().schedule(*args, **kwargs)

    def _share_slots(self, max_loras: int) -> None:
        takes = plan(
            self.running,
            self.waiting,
            max_loras=max_loras,
            quantum=self.quantum,
            turn_start=self._turn_start,
            waiting_since=self._waiting_since,
        )
        if not takes:
            return
        now, timestamp = time.time(), time.monotonic()
        paused: list[Request] = [victim for _, victims in takes for victim in victims]  # type: ignore[misc]
        for victim in paused:
            self.running.remove(victim)
            self._preempt_request(victim, timestamp)
            self._turn_start[victim.request_id] = victim.num_output_tokens
            self._waiting_since[victim.request_id] = now
        # vLLM puts a preempted request at the queue's front: these go to its back, and the
        # requests their slots were taken for to its front, in the plan's order.
        wanted: list[Request] = [request for request, _ in takes]  # type: ignore[misc]
        for request in wanted:
            self._turn_start[request.request_id] = request.num_output_tokens
        self.waiting.remove_requests([*paused, *wanted])
        for victim in paused:
            self.waiting.add_request(victim)
        self.waiting.prepend_requests(reversed(wanted))  # extendleft: the last goes first

    def _forget_finished(self) -> None:
        for request_id in [r for r in self._turn_start if r not in self.requests]:
            del self._turn_start[request_id]
            self._waiting_since.pop(request_id, None)


class AsyncSlotSharingScheduler(SlotSharingScheduler, AsyncScheduler):
    """The same over vLLM's asynchronous scheduler (vLLM's preemption keeps its in-flight
    output apart)."""
