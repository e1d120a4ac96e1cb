"""Fair admission on the event loop: waiting, leaving the queue, and refusals with 429."""

from __future__ import annotations

import asyncio
import time

import pytest

from app import metrics
from app.engine.base import EngineLoad
from app.scheduling import AdmissionRefused, FairAdmission, FairQueue, Ticket, admission_for
from app.scheduling.fair import LOAD_POLL_SECONDS
from app.scheduling.fcfs import FcfsAdmission
from app.serving.backend import backend_factory
from app.serving.in_process.backend import start_vllm_engine
from app.settings import Settings

# What a wait for a loop turn or two is given: it bounds a hang, never a verdict on time (a busy
# machine may stall the process for longer than the work takes).
HANG_SECONDS = 60


def admission(
    *, window: int = 1, headroom: int = 0, depth: int = 8, seconds: float = 30.0
) -> FairAdmission:
    fair = FairQueue(
        window=window, headroom=headroom, quantum=100, max_adapter_wait=10.0, max_loras=2
    )
    return FairAdmission(fair, max_queue_depth=depth, max_queue_seconds=seconds)


def ticket(tenant: str, number: int, weight: int = 1) -> Ticket:
    return Ticket(f"{tenant}-{number}", tenant, weight, 100)


async def settle_loop() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_request_waits_for_a_slot_and_takes_it_when_one_is_released() -> None:
    fair = admission()
    first = fair.admit(ticket("a", 0))
    await first.acquire()
    second = fair.admit(ticket("a", 1))
    waiting = asyncio.create_task(second.acquire())
    await settle_loop()
    assert not waiting.done() and fair.queue.depth("a") == 1
    first.release()
    await asyncio.wait_for(waiting, HANG_SECONDS)
    assert fair.queue.in_flight == 1
    second.release()
    assert fair.queue.in_flight == 0


async def test_a_slot_granted_beyond_the_batch_says_it_went_through_the_headroom() -> None:
    """Granted at once or after a wait: the request then carries the mark that has the
    engine seat it (app.serving.lifecycle.tracking)."""
    fair = admission(window=3, headroom=1)  # a batch of 2, and 1 beyond it
    flood = [fair.admit(ticket("a", n)) for n in range(3)]
    for slot in flood[:2]:
        await slot.acquire()
    waiting = asyncio.create_task(flood[2].acquire())
    newcomer = fair.admit(ticket("b", 0))
    await newcomer.acquire()  # at once, beyond the batch
    assert newcomer.through_headroom
    assert not any(slot.through_headroom for slot in flood[:2])
    newcomer.release()
    flood[0].release()
    await asyncio.wait_for(waiting, HANG_SECONDS)  # after a wait, within the batch
    assert not flood[2].through_headroom
    late = fair.admit(ticket("b", 1))
    await late.acquire()
    assert late.through_headroom
    for slot in (late, *flood[1:]):
        slot.release()


async def test_a_full_queue_is_a_429_with_retry_after() -> None:
    fair = admission(depth=2)
    held = fair.admit(ticket("a", 0))
    await held.acquire()
    queued = [asyncio.create_task(fair.admit(ticket("a", n)).acquire()) for n in (1, 2)]
    await settle_loop()
    with pytest.raises(AdmissionRefused) as refused:
        await fair.admit(ticket("a", 3)).acquire()
    error = refused.value
    assert (error.status_code, error.code, error.reason) == (
        429,
        "rate_limit_exceeded",
        "queue_full",
    )
    assert int(error.headers["retry-after"]) >= 1
    # Another tenant's queue is its own.
    other = asyncio.create_task(fair.admit(ticket("b", 0)).acquire())
    await settle_loop()
    assert not other.done()
    for task in (*queued, other):
        task.cancel()
    await asyncio.gather(*queued, other, return_exceptions=True)
    assert fair.queue.waiting() == 0


async def test_retry_after_grows_with_the_queue_ahead() -> None:
    fair = admission(depth=100)
    held = fair.admit(ticket("a", 0))
    await held.acquire()
    short = fair.retry_after(ticket("a", 1))
    queued = [asyncio.create_task(fair.admit(ticket("a", n)).acquire()) for n in range(1, 20)]
    await settle_loop()
    assert fair.retry_after(ticket("a", 20)) > 10 * short
    for task in queued:
        task.cancel()
    await asyncio.gather(*queued, return_exceptions=True)


async def test_a_request_that_waits_too_long_is_a_429_and_leaves_the_queue() -> None:
    fair = admission(seconds=0.05)
    held = fair.admit(ticket("a", 0))
    await held.acquire()
    with pytest.raises(AdmissionRefused) as refused:
        await fair.admit(ticket("a", 1)).acquire()
    assert refused.value.reason == "queue_timeout"
    assert "retry-after" in refused.value.headers
    assert fair.queue.depth("a") == 0
    held.release()
    assert fair.queue.in_flight == 0


async def test_a_cancelled_wait_leaves_the_queue_at_once_and_holds_nothing() -> None:
    fair = admission()
    held = fair.admit(ticket("a", 0))
    await held.acquire()
    leaving = asyncio.create_task(fair.admit(ticket("b", 0)).acquire())
    await settle_loop()
    assert fair.queue.depth("b") == 1
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert fair.queue.depth("b") == 0
    held.release()
    assert fair.queue.in_flight == 0


async def test_a_wait_cancelled_as_it_was_granted_gives_the_slot_back() -> None:
    fair = admission()
    held = fair.admit(ticket("a", 0))
    await held.acquire()
    late = asyncio.create_task(fair.admit(ticket("b", 0)).acquire())
    await settle_loop()
    held.release()  # grants b's slot; b has not run yet
    late.cancel()
    with pytest.raises(asyncio.CancelledError):
        await late
    assert fair.queue.in_flight == 0


async def test_a_slot_is_given_back_once() -> None:
    fair = admission(window=2)
    slot = fair.admit(ticket("a", 0))
    await slot.acquire()
    assert fair.queue.in_flight == 1
    slot.release()
    slot.release()
    assert fair.queue.in_flight == 0


def test_the_policy_is_chosen_once_from_the_settings() -> None:
    base = {"_env_file": None}
    assert isinstance(admission_for(Settings(**base)), FairAdmission)  # type: ignore[arg-type]
    fcfs = Settings(**base, scheduler="fcfs")  # type: ignore[arg-type]
    assert isinstance(admission_for(fcfs), FcfsAdmission)
    # The front admits first come, first served (the llm-d router keeps tenants fair there).
    front = Settings(**base, role="front", upstream_url="http://upstream")  # type: ignore[arg-type]
    assert isinstance(backend_factory(front, start_vllm_engine).admission, FcfsAdmission)
    assert isinstance(backend_factory(Settings(**base), start_vllm_engine).admission, FairAdmission)  # type: ignore[arg-type]
    # The tenants share the engine's whole batch; the headroom goes in beyond it.
    sized = admission_for(Settings(**base, max_num_seqs=24, scheduler_headroom_slots=3))  # type: ignore[arg-type]
    assert isinstance(sized, FairAdmission) and sized.queue.window == 27
    assert sized.queue.window - sized.queue.headroom == 24
    # Requests that crowd the slots are held where the engine takes no turns for them.
    for quantum, objectives, held in [
        (16, {}, False),
        (0, {}, True),
        (0, {"slo_ttft_ms_batch": 9}, False),
    ]:
        fair = admission_for(Settings(**base, lora_slot_quantum_tokens=quantum, **objectives))  # type: ignore[arg-type]
        assert isinstance(fair, FairAdmission) and fair.queue.affinity.hold == held


class ReportingEngine:
    """An engine's load reports, and nothing else of it."""

    def __init__(self) -> None:
        self.report: EngineLoad | None = None

    def load(self) -> EngineLoad | None:
        return self.report


async def reported(
    engine: ReportingEngine,
    running: int,
    waiting: int,
    kv: float,
    following: FairAdmission | None = None,
) -> None:
    """Two new reports, each seen by ``following``'s poll (waited for: a busy machine may
    delay the poll by many periods); with no admission following, three poll periods each."""
    for _ in range(2):
        step = engine.report.step + 1 if engine.report else 0
        engine.report = EngineLoad(running, waiting, kv, step)
        if following is None:
            await asyncio.sleep(3 * LOAD_POLL_SECONDS)
            continue
        deadline = time.monotonic() + 60  # bounds a hang only
        while following._step != step:
            assert time.monotonic() < deadline, "the poll never saw the report"
            await asyncio.sleep(LOAD_POLL_SECONDS)


@pytest.mark.parametrize(("fixed", "after"), [(None, 4 + 2), (16, 16 + 2)])
async def test_the_window_follows_the_engines_reports_unless_it_is_set(
    fixed: int | None, after: int
) -> None:
    """The window is the batch the tenants share and the headroom (2) beyond it."""
    settings = Settings(_env_file=None, max_num_seqs=16, scheduler_window=fixed)  # type: ignore[call-arg]
    fair = admission_for(settings)
    assert isinstance(fair, FairAdmission) and fair.queue.window == 16 + 2
    engine = ReportingEngine()
    fair.follow(engine)  # type: ignore[arg-type]
    try:
        # Requests wait inside the engine, whose memory is full with 4 running.
        await reported(engine, running=4, waiting=10, kv=1.0, following=fair)
        assert fair.queue.window == after
        assert metrics.SCHEDULER_SLOTS.labels("window")._value.get() == after
    finally:
        fair.follow(None)
    # Stopped following: reports change nothing any more.
    await reported(engine, running=2, waiting=10, kv=1.0)
    assert fair.queue.window == after


async def test_the_load_poll_rests_while_the_engine_is_idle_until_a_request_arrives() -> None:
    fair = admission_for(Settings(_env_file=None, max_num_seqs=16))  # type: ignore[call-arg]
    assert isinstance(fair, FairAdmission)
    engine = ReportingEngine()
    fair.follow(engine)  # type: ignore[arg-type]
    slot = fair.admit(ticket("a", 0))
    try:
        engine.report = EngineLoad(0, 0, 0.0, 0)  # nothing running, nothing waiting
        deadline = time.monotonic() + 60  # bounds a hang only
        while fair._step != 0:
            assert time.monotonic() < deadline, "the poll never saw the report"
            await asyncio.sleep(LOAD_POLL_SECONDS)
        engine.report = EngineLoad(0, 0, 0.0, 1)
        await asyncio.sleep(5 * LOAD_POLL_SECONDS)
        assert fair._step == 0  # resting: not read
        await slot.acquire()
        while fair._step != 1:
            assert time.monotonic() < deadline, "the poll never resumed"
            await asyncio.sleep(LOAD_POLL_SECONDS)
    finally:
        fair.follow(None)
        slot.release()


async def test_paced_requests_go_in_as_the_engine_reports_its_steps() -> None:
    settings = Settings(_env_file=None, max_num_seqs=16, scheduler_dispatches_per_step=2)  # type: ignore[call-arg]
    fair = admission_for(settings)
    assert isinstance(fair, FairAdmission)
    engine = ReportingEngine()
    fair.follow(engine)  # type: ignore[arg-type]
    try:
        slots = [fair.admit(ticket("a", n)) for n in range(6)]
        waits = [asyncio.create_task(slot.acquire()) for slot in slots]
        deadline = time.monotonic() + 60  # bounds a hang only
        while sum(w.done() for w in waits) < 2:
            assert time.monotonic() < deadline, "the first two never went in"
            await asyncio.sleep(LOAD_POLL_SECONDS)
        await asyncio.sleep(3 * LOAD_POLL_SECONDS)
        assert sum(w.done() for w in waits) == 2  # no step reported yet
        await reported(engine, running=2, waiting=0, kv=0.1, following=fair)  # two steps
        # Let in by the steps: their waits end as the loop next runs them.
        await asyncio.wait_for(asyncio.gather(*waits), 60)  # bounds a hang only
    finally:
        fair.follow(None)
        for slot in slots:
            slot.release()


async def test_spare_work_runs_on_an_idle_engine_only_and_stops_when_a_request_goes_in() -> None:
    fair = admission(window=3, headroom=1)
    stopped: list[str] = []
    spare = await fair.spare(ticket("a", 0), lambda: stopped.append("spare"), wait=0)
    assert spare is not None
    assert await fair.spare(ticket("a", 1), lambda: None, wait=0) is None  # one at a time
    assert fair.queue.in_flight == 0  # it takes no request's slot

    request = fair.admit(ticket("b", 0))
    await asyncio.wait_for(request.acquire(), HANG_SECONDS)
    assert stopped == ["spare"]
    second = fair.admit(ticket("b", 1))
    await asyncio.wait_for(second.acquire(), HANG_SECONDS)
    assert stopped == ["spare"]  # preempted once
    spare.release()
    assert await fair.spare(ticket("a", 2), lambda: None, wait=0) is None  # requests run
    request.release()
    second.release()
    assert await fair.spare(ticket("a", 3), lambda: None, wait=0) is not None


async def test_no_spare_work_while_a_request_waits() -> None:
    fair = admission(window=1)
    held = fair.admit(ticket("a", 0))
    await held.acquire()
    waiting = asyncio.create_task(fair.admit(ticket("a", 1)).acquire())
    await settle_loop()
    assert await fair.spare(ticket("b", 0), lambda: None, wait=0) is None
    held.release()
    await asyncio.wait_for(waiting, HANG_SECONDS)


async def test_fcfs_admits_spare_work_only_where_something_after_it_sheds_it() -> None:
    assert await FcfsAdmission().spare(ticket("a", 0), lambda: None, wait=0) is None
    assert await FcfsAdmission(spare=True).spare(ticket("a", 0), lambda: None, wait=0) is not None


async def test_spare_work_waits_for_the_engine_to_become_idle_or_is_dropped() -> None:
    fair = admission(window=2)
    request = fair.admit(ticket("a", 0))
    await request.acquire()
    assert await fair.spare(ticket("a", 1), lambda: None, wait=0.05) is None  # dropped
    waiting = asyncio.create_task(fair.spare(ticket("a", 2), lambda: None, wait=5))
    await settle_loop()
    assert not waiting.done()
    request.release()
    assert await asyncio.wait_for(waiting, HANG_SECONDS) is not None
