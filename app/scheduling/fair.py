"""Fair admission on the event loop: requests wait for :class:`~app.scheduling.policy.FairQueue`
to let them into the engine, within per-tenant limits on queue depth and time; the window
follows the engine's load (:class:`~app.scheduling.window.AdaptiveWindow`) where the engine
reports it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from app import metrics
from app.engine.base import Engine, EngineLoad, ReportsLoad
from app.scheduling.base import Ticket
from app.scheduling.errors import AdmissionRefused, RefusalReason
from app.scheduling.policy import FairQueue, Waiting
from app.scheduling.window import AdaptiveWindow

logger = logging.getLogger(__name__)

# Weight of the newest request in the running mean of how long a request holds its slot,
# which Retry-After is estimated from.
HOLD_SMOOTHING = 0.2
FIRST_HOLD_GUESS_SECONDS = 1.0
# How often the window reads the engine's load when no request comes or goes (it also reads
# it at each of those); a report seen before changes nothing.
LOAD_POLL_SECONDS = 0.05
# Spare work (shadow requests) is a sample: one run at a time on the idle engine, so that a
# request arriving next meets one sequence to abort, not a burst; and a bounded backlog.
SPARE_RUNS = 1
SPARE_WAITERS = 64

_SLOTS = metrics.Children(metrics.SCHEDULER_SLOTS)
_DISPATCHES = metrics.Children(metrics.SCHEDULER_DISPATCHES)
_QUEUE_WAIT = metrics.Children(metrics.SCHEDULER_QUEUE_WAIT)
_QUEUE_DEPTH = metrics.Children(metrics.SCHEDULER_QUEUE_DEPTH)


class FairAdmission:
    def __init__(
        self,
        queue: FairQueue,
        *,
        max_queue_depth: int,
        max_queue_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        window: AdaptiveWindow | None = None,
    ) -> None:
        """``window``: the controller that sizes the engine's batch from its load, which the
        tenants share, ``queue``'s headroom going in beyond it (``None``: ``queue``'s window
        stays as it is)."""
        self.queue = queue
        self.max_queue_depth = max_queue_depth
        self.max_queue_seconds = max_queue_seconds
        self._clock = clock
        # Each waiting request's grant: whether it went in through the headroom.
        self._granted: dict[int, asyncio.Future[bool]] = {}
        self._mean_hold = FIRST_HOLD_GUESS_SECONDS
        self._window = window
        self._load: Callable[[], EngineLoad | None] | None = None
        self._step: int | None = None  # the engine's last report seen
        self._poller: asyncio.Task[None] | None = None
        self._spares: set[SpareSlot] = set()
        # Set when the engine may have become idle: spare work waiting for it looks again.
        self._idle = asyncio.Event()
        # Set when a request arrives: the load poll, stopped while the engine is idle, resumes.
        self._work = asyncio.Event()
        self._spare_waiters = 0
        if window is not None:
            queue.resize(window.size + queue.headroom_slots)
        metrics.SCHEDULER_SLOTS.labels("window").set(queue.window)
        metrics.SCHEDULER_SLOTS.labels("in_flight").set(0)

    def admit(self, ticket: Ticket) -> FairSlot:
        return FairSlot(self, ticket)

    async def spare(
        self, ticket: Ticket, preempt: Callable[[], object], *, wait: float
    ) -> SpareSlot | None:
        """The engine once it is idle, within ``wait`` seconds: no request in it or waiting,
        and no other spare run (:data:`SPARE_RUNS`). Every request counts, however small: on
        a CPU each sequence in the batch slows the others. Given up through ``preempt`` as
        soon as a request goes in. Dropped at once when :data:`SPARE_WAITERS` wait already."""
        if self._spare_waiters >= SPARE_WAITERS:
            return None
        deadline = self._clock() + wait
        self._spare_waiters += 1
        try:
            while not self._idle_for_spare():
                remaining = deadline - self._clock()
                if remaining <= 0:
                    return None
                self._idle.clear()
                try:
                    await asyncio.wait_for(self._idle.wait(), remaining)
                except TimeoutError:
                    return None
        finally:
            self._spare_waiters -= 1
        slot = SpareSlot(self, preempt)
        self._spares.add(slot)
        self._work.set()
        return slot

    def _idle_for_spare(self) -> bool:
        queue = self.queue
        return not queue.in_flight and not queue.waiting() and len(self._spares) < SPARE_RUNS

    def follow(self, engine: Engine | None) -> None:
        """Read ``engine``'s load reports from now on, where it makes them: into the gauges,
        and into the window where it adapts; ``None``: stop."""
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None
        self._load = None
        self._step = None
        self.queue.pace(isinstance(engine, ReportsLoad))
        if not isinstance(engine, ReportsLoad):
            return
        self._load = engine.load
        self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        """Follow the engine's reports while it has work; while it has none (and has said so),
        wait for the next request rather than wake for nothing."""
        while True:
            await asyncio.sleep(LOAD_POLL_SECONDS)
            try:
                if self._adapt():
                    self._dispatch()
            except Exception:
                logger.exception("the admission window could not follow the engine's load")
            if self._engine_idle():
                self._work.clear()
                await self._work.wait()

    def _engine_idle(self) -> bool:
        queue = self.queue
        if queue.in_flight or queue.waiting() or self._spares or self._load is None:
            return False
        load = self._load()
        return load is not None and not load.running and not load.waiting

    def _adapt(self) -> bool:
        """Read the engine's latest report (shown as gauges): a new step opens the pacing
        anew, and the window follows the load where it adapts; whether it was new."""
        if self._load is None:
            return False
        load = self._load()
        if load is None or load.step == self._step:
            return False
        steps = 1 if self._step is None else max(1, load.step - self._step)
        self._step = load.step
        self.queue.new_step(steps)
        metrics.set_held(_SLOTS("engine_running"), load.running)
        metrics.set_held(_SLOTS("engine_waiting"), load.waiting)
        if self._window is None:
            return True
        before = self.queue.window
        batch = self._window.observe(load, held_back=self.queue.held_back())
        after = batch + self.queue.headroom_slots
        if after != before:
            self.queue.resize(after)
            metrics.SCHEDULER_SLOTS.labels("window").set(after)
        return True

    def retry_after(self, ticket: Ticket) -> float:
        """Seconds until the tenant's queue has moved by its own length, at its fair share of
        the window and the recent time a request holds a slot."""
        queue = self.queue
        slots = max(1.0, queue.share(ticket.tenant, ticket.weight))
        return self._mean_hold * (queue.depth(ticket.tenant) + 1) / slots

    # -- driven by the slots ------------------------------------------------------

    def _enqueue(self, ticket: Ticket) -> tuple[Waiting, asyncio.Future[bool]]:
        if self.queue.depth(ticket.tenant) >= self.max_queue_depth:
            raise self._refuse(ticket, "queue_full")
        waiting = self.queue.push(ticket, self._clock())
        self._work.set()
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._granted[id(waiting)] = future
        self._depth_changed(ticket.tenant)
        self._dispatch(immediate=waiting)
        return waiting, future

    def _leave(self, waiting: Waiting) -> None:
        self._granted.pop(id(waiting), None)
        self.queue.remove(waiting)
        self._depth_changed(waiting.ticket.tenant)

    def _refuse(self, ticket: Ticket, reason: RefusalReason) -> AdmissionRefused:
        metrics.SCHEDULER_REJECTIONS.labels(ticket.tenant, reason).inc()
        return AdmissionRefused(reason, self.retry_after(ticket))

    def _release(self, ticket: Ticket, held: float, used: int | None) -> None:
        self._mean_hold += HOLD_SMOOTHING * (held - self._mean_hold)
        self.queue.done(ticket, used)
        self._dispatch()
        if not self.queue.in_flight:
            self._idle.set()

    def _started(self, ticket: Ticket) -> None:
        """``ticket``'s first token arrived: batch lines it held back may go."""
        self.queue.started(ticket)
        if self.queue.waiting():
            self._dispatch()

    def _release_spare(self, slot: SpareSlot) -> None:
        self._spares.discard(slot)
        self._idle.set()

    def _dispatch(self, immediate: Waiting | None = None) -> None:
        self._adapt()
        now = self._clock()
        while (dispatch := self.queue.pop(now)) is not None:
            waiting = dispatch.waiting
            ticket = waiting.ticket
            future = self._granted.pop(id(waiting))
            self._depth_changed(ticket.tenant)
            if future.done():
                # Its client left in the same tick, before it could leave the queue.
                self.queue.done(ticket, 0)
                continue
            reason = "immediate" if waiting is immediate else dispatch.reason
            metrics.add_held(_DISPATCHES(reason))
            metrics.held(_QUEUE_WAIT(ticket.tenant)).observe(now - waiting.since)
            future.set_result(waiting.through_headroom)
            # The engine is the request's: spare work stops.
            for spare in list(self._spares):
                spare.preempt()
        metrics.set_held(_SLOTS("in_flight"), self.queue.in_flight)

    def _depth_changed(self, tenant: str) -> None:
        metrics.set_held(_QUEUE_DEPTH(tenant), self.queue.depth(tenant))


class FairSlot:
    def __init__(self, admission: FairAdmission, ticket: Ticket) -> None:
        self._admission = admission
        self._ticket = ticket
        self._held_since: float | None = None
        self._used: int | None = None
        self.through_headroom = False

    async def acquire(self) -> None:
        admission = self._admission
        waiting, granted = admission._enqueue(self._ticket)
        if granted.done():  # a seat was free: nothing to wait for, nor to time out
            self._held_since = admission._clock()
            self.through_headroom = granted.result()
            return
        try:
            async with asyncio.timeout(admission.max_queue_seconds):
                await asyncio.shield(granted)
        except TimeoutError:
            if not granted.done():
                admission._leave(waiting)
                raise admission._refuse(self._ticket, "queue_timeout") from None
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self._held_since = admission._clock()
                self.release()
            else:
                granted.cancel()
                admission._leave(waiting)
            raise
        self._held_since = admission._clock()
        self.through_headroom = granted.result()

    def settle(self, tokens: int) -> None:
        self._used = tokens

    def started(self) -> None:
        if self._held_since is not None:
            self._admission._started(self._ticket)

    def release(self) -> None:
        if self._held_since is None:
            return
        held, self._held_since = self._admission._clock() - self._held_since, None
        self._admission._release(self._ticket, held, self._used)


class SpareSlot:
    """The idle engine, held at once; :meth:`preempt` stops its work (once)."""

    through_headroom = False

    def __init__(self, admission: FairAdmission, stop: Callable[[], object]) -> None:
        self._admission = admission
        self._stop: Callable[[], object] | None = stop

    def preempt(self) -> None:
        stop, self._stop = self._stop, None
        if stop is not None:
            stop()

    async def acquire(self) -> None:
        return None

    def settle(self, tokens: int) -> None:
        return None

    def started(self) -> None:
        return None

    def release(self) -> None:
        self._admission._release_spare(self)
