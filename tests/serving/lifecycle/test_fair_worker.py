"""The tokenizer's thread takes tenants in turn: a tenant's queue of long jobs holds another
tenant behind the one job running, not behind all of them."""

from __future__ import annotations

import asyncio
import threading

import pytest

from app.serving.lifecycle.fair_worker import FairWorker


class Gate:
    """Jobs that record their order and wait, on the worker's thread, until released."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.open = threading.Event()

    def job(self, name: str) -> object:
        def work() -> str:
            self.order.append(name)
            assert self.open.wait(60), "the gate was never opened"
            return name

        return work


async def started(gate: Gate, count: int) -> None:
    while len(gate.order) < count:
        await asyncio.sleep(0.001)


async def test_tenants_take_turns_whatever_one_has_queued() -> None:
    worker, gate = FairWorker("test"), Gate()
    try:
        flood = [asyncio.ensure_future(worker.run("a", gate.job(f"a{i}"))) for i in range(4)]  # type: ignore[arg-type]
        await started(gate, 1)
        victim = asyncio.ensure_future(worker.run("b", gate.job("b0")))  # type: ignore[arg-type]
        more = asyncio.ensure_future(worker.run("a", gate.job("a4")))  # type: ignore[arg-type]
        gate.open.set()
        assert await asyncio.gather(*flood, victim, more) == ["a0", "a1", "a2", "a3", "b0", "a4"]
    finally:
        worker.close()
    # b's job ran right after the one of a's that was running when it came.
    assert gate.order == ["a0", "b0", "a1", "a2", "a3", "a4"]


async def test_a_job_cancelled_while_it_waits_never_runs_and_a_running_one_finishes() -> None:
    worker, gate = FairWorker("test"), Gate()
    try:
        running = asyncio.ensure_future(worker.run("a", gate.job("a0")))  # type: ignore[arg-type]
        await started(gate, 1)
        waiting = asyncio.ensure_future(worker.run("a", gate.job("a1")))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        running.cancel()
        waiting.cancel()
        await asyncio.gather(running, waiting, return_exceptions=True)
        # Its client left, but the job still holds the thread: the worker is not idle.
        assert not worker.idle
        gate.open.set()
        assert await worker.run("b", gate.job("b0")) == "b0"  # type: ignore[arg-type]
        assert worker.idle
    finally:
        worker.close()
    assert gate.order == ["a0", "b0"]


async def test_a_failing_job_raises_to_its_caller_and_the_next_one_runs() -> None:
    worker = FairWorker("test")

    def fails() -> None:
        raise ValueError("bad prompt")

    try:
        with pytest.raises(ValueError, match="bad prompt"):
            await worker.run("a", fails)
        assert await worker.run("a", lambda: 7) == 7
    finally:
        worker.close()
