"""A scripted engine behind the :class:`~app.engine.base.Engine` interface, for serving tests
that need no model: it behaves like vLLM's AsyncLLM where the serving layer can tell.

Each request produces ``max_tokens`` tokens per choice, one step every ``step_seconds``, in a
producer task that runs whether or not anyone reads: like vLLM's output collector, deltas a
slow reader has not taken yet are merged. Like vLLM's ``stream_interval`` (the engine's,
raised by a request's), a request hands over its first token at once, then an output once it
holds that many tokens, and the last. ``abort`` ends a request with one last output that
carries what was produced and not read (finish reason ``abort``); closing the stream (or
cancelling a read) aborts it too, and hands what was produced and not read to
``on_abandoned``. ``fail_after`` makes requests raise ``error`` once that many tokens were read.
:class:`SeatedEngine` runs a fixed number of requests at once and queues the rest, as vLLM's
scheduler does when its batch or memory is full, and seats a request let in through the front's
headroom at once, as our scheduler in vLLM's engine core does; both report their load as
vLLM's scheduler does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm import CompletionOutput, RequestOutput, SamplingParams

from app.engine.base import EngineLoad
from app.inside_vllm.objectives import Objectives, through_headroom
from app.tenancy.adapters import Adapter
from tools.gateway_cost.engine import VOCABULARY as VOCABULARY  # the toy vocabulary, re-exported
from tools.gateway_cost.engine import CharTokenizer


def token_text(token: int) -> str:
    return chr(ord("a") + token % 26)


def held_seat() -> asyncio.Event:
    seat = asyncio.Event()
    seat.set()
    return seat


@dataclass
class ScriptedRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    adapter: Adapter | None
    cache_salt: str | None
    produced: int = 0
    read: int = 0
    aborted: bool = False
    closed: bool = False
    pending: RequestOutput | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    finished: bool = False
    # Tokens an output gathers before it is handed over (the first and the last go at once).
    interval: int = 1
    # Tokens produced and held back until the output gathers ``interval`` of them.
    held: list[int] = field(default_factory=list)
    # The trace context it came with (vLLM's span of it would go under it).
    trace_headers: dict[str, str] | None = None
    # Set while it holds a seat in the engine's batch: it produces only then.
    seat: asyncio.Event = field(default_factory=held_seat)

    def put(self, output: RequestOutput) -> None:
        if self.pending is None:
            self.pending = output
        else:
            self.pending.add(output, aggregate=True)
        self.ready.set()


class ScriptedEngine:
    def __init__(
        self,
        *,
        max_model_len: int = 2_000_000,
        step_seconds: float = 0.0,
        fail_after: int | None = None,
        error: Exception | None = None,
        last_finish_reason: str = "length",
        stream_interval: int = 1,
    ) -> None:
        self.max_model_len = max_model_len
        self.stream_interval = stream_interval
        self.step_seconds = step_seconds
        self.fail_after = fail_after
        self.error = error or RuntimeError("scripted engine failure")
        self.last_finish_reason = last_finish_reason
        self.requests: dict[str, ScriptedRequest] = {}
        self.aborted: list[str] = []
        self._tokenizer = CharTokenizer()
        self._producers: set[asyncio.Task[None]] = set()
        # Tokens produced by all requests: each is one engine step, which vLLM reports on.
        self.steps = 0

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def started(self) -> list[ScriptedRequest]:
        """Every request the engine was given, in order."""
        return list(self.requests.values())

    def num_unfinished_requests(self) -> int:
        return sum(not r.finished for r in self.requests.values())

    def load(self) -> EngineLoad | None:
        """Every unfinished request runs; nothing waits, and memory is never short."""
        return EngineLoad(
            running=self.num_unfinished_requests(), waiting=0, kv_cache_usage=0.0, step=self.steps
        )

    async def check_health(self) -> None:
        return None

    async def remove_adapter(self, adapter: Adapter) -> None:
        return None

    async def abort(self, request_id: str) -> None:
        request = self.requests.get(request_id)
        if request is None or request.finished:
            return
        self.aborted.append(request_id)
        request.aborted = True
        request.finished = True
        held, request.held = request.held, []
        request.put(self._output(request, held, finish_reason="abort"))

    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        request_id: str,
        adapter: Adapter | None,
        cache_salt: str | None = None,
        on_abandoned: Callable[[RequestOutput], None] | None = None,
        trace_headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[RequestOutput]:
        request = ScriptedRequest(request_id, list(prompt_token_ids), params, adapter, cache_salt)
        request.trace_headers = dict(trace_headers) if trace_headers is not None else None
        request.interval = max(self.stream_interval, params.stream_interval or 1)
        self.requests[request_id] = request
        producer = asyncio.create_task(self._produce(request))
        self._producers.add(producer)
        producer.add_done_callback(self._producers.discard)
        try:
            while True:
                while request.pending is None:
                    request.ready.clear()
                    await request.ready.wait()
                output, request.pending = request.pending, None
                tokens = sum(len(o.token_ids) for o in output.outputs) // max(params.n, 1)
                if self.fail_after is not None and request.read + tokens > self.fail_after:
                    raise self.error
                request.read += tokens
                yield output
                if output.finished:
                    return
        finally:
            request.closed = True
            if not request.finished:
                await self.abort(request_id)
            unread, request.pending = request.pending, None
            if unread is not None and on_abandoned is not None:
                on_abandoned(unread)
            producer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await producer

    async def _produce(self, request: ScriptedRequest) -> None:
        budget = request.params.max_tokens or 1
        while request.produced < budget and not request.finished:
            await request.seat.wait()
            await asyncio.sleep(self.step_seconds)
            if request.finished:
                return
            if not request.seat.is_set():
                continue  # paused during the step: its token waits for its seat
            request.produced += 1
            self.steps += 1
            last = request.produced == budget
            token = len(request.prompt_token_ids) + request.produced
            request.finished = last
            request.held.append(token)
            if last or request.produced == 1 or len(request.held) >= request.interval:
                finish_reason = self.last_finish_reason if last else None
                held, request.held = request.held, []
                request.put(self._output(request, held, finish_reason=finish_reason))

    def _output(
        self, request: ScriptedRequest, tokens: list[int], *, finish_reason: str | None
    ) -> RequestOutput:
        choices = [
            CompletionOutput(
                index=i,
                text="".join(token_text(t) for t in tokens),
                token_ids=list(tokens),
                cumulative_logprob=None,
                logprobs=None,
                finish_reason=finish_reason,
            )
            for i in range(request.params.n)
        ]
        return RequestOutput(
            request.request_id,
            None,
            request.prompt_token_ids,
            None,
            choices,
            finished=finish_reason is not None,
        )


class SeatedEngine(ScriptedEngine):
    """A scripted engine that runs at most ``seats`` requests at once; the others wait for a
    seat in arrival order and produce nothing meanwhile, as requests wait in vLLM's queue when
    its batch or KV cache is full: its report counts them waiting, and its memory as full as
    its seats. A request let in through the front's headroom (its mark in ``extra_args``) is
    seated at once, as our scheduler in vLLM's engine core seats it: a running request gives
    its seat up, a batch request first, else one of the tenant (its cache salt) running the
    most, one that has produced a token first, the one with the most tokens left, and is
    paused until a seat frees, when it goes back first."""

    def __init__(self, seats: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seats = seats
        self.peak = 0
        # Request ids in the order they first took a seat.
        self.seated: list[str] = []
        # Request id -> requests seated between its arrival and its own seat.
        self.waited_behind: dict[str, int] = {}
        # Request ids in the order they gave their seat to a request through the headroom.
        self.unseated: list[str] = []
        self._running: list[ScriptedRequest] = []
        self._paused: deque[ScriptedRequest] = deque()
        self._queue: deque[tuple[ScriptedRequest, int]] = deque()

    @property
    def running(self) -> int:
        return len(self._running)

    def load(self) -> EngineLoad | None:
        return EngineLoad(
            running=self.running,
            waiting=self.num_unfinished_requests() - self.running,
            kv_cache_usage=self.running / self.seats,
            step=self.steps,
        )

    async def _produce(self, request: ScriptedRequest) -> None:
        self._arrive(request)
        try:
            await super()._produce(request)
        finally:
            self._leave(request)

    def _arrive(self, request: ScriptedRequest) -> None:
        request.seat.clear()
        arrived = len(self.seated)
        if self.running < self.seats:
            self._seat(request, arrived)
        elif through_headroom(request.params.extra_args) and (
            victim := self._seat_to_reclaim(request)
        ):
            self._running.remove(victim)
            victim.seat.clear()
            self._paused.append(victim)
            self.unseated.append(victim.request_id)
            self._seat(request, arrived)
        else:
            self._queue.append((request, arrived))

    def _seat(self, request: ScriptedRequest, arrived: int) -> None:
        self.waited_behind[request.request_id] = len(self.seated) - arrived
        self.seated.append(request.request_id)
        self._running.append(request)
        request.seat.set()
        self.peak = max(self.peak, self.running)

    def _leave(self, request: ScriptedRequest) -> None:
        if request in self._running:
            self._running.remove(request)
        elif request in self._paused:
            self._paused.remove(request)
        else:
            self._queue = deque(q for q in self._queue if q[0] is not request)
        while self.running < self.seats and (self._paused or self._queue):
            if self._paused:
                paused = self._paused.popleft()
                self._running.append(paused)
                paused.seat.set()
            else:
                self._seat(*self._queue.popleft())

    def _seat_to_reclaim(self, taker: ScriptedRequest) -> ScriptedRequest | None:
        running = Counter(r.cache_salt for r in self._running)

        def batch(request: ScriptedRequest) -> bool:
            objectives = Objectives.of(request.params.extra_args)
            return objectives is not None and not objectives.interactive

        candidates = (r for r in self._running if batch(r) or r.cache_salt != taker.cache_salt)
        return max(
            candidates,
            key=lambda r: (
                batch(r),
                running[r.cache_salt],
                r.produced > 0,
                (r.params.max_tokens or 1) - r.produced,
            ),
            default=None,
        )
