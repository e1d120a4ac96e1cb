from __future__ import annotations

import asyncio
from pathlib import Path

from app.serving.lifecycle.inflight import InFlight
from app.tenancy.adapters import Adapter

# What a wait for a loop turn is given: it bounds a hang, never a verdict on time.
HANG_SECONDS = 60
ADAPTER = Adapter("a", 1, "0" * 64, Path("/a"), 8, ("q_proj",), lora_id=1)


async def test_removal_waits_for_running_requests() -> None:
    in_flight = InFlight()
    with in_flight.hold(None):  # base-model requests are not tracked
        await asyncio.wait_for(in_flight.wait_idle(ADAPTER), timeout=HANG_SECONDS)
    first, second = in_flight.hold(ADAPTER), in_flight.hold(ADAPTER)
    with first:
        second.__enter__()
        waiter = asyncio.create_task(in_flight.wait_idle(ADAPTER))
        await asyncio.sleep(0.01)
        assert not waiter.done()
    await asyncio.sleep(0.01)
    assert not waiter.done()  # one request still runs
    second.__exit__(None, None, None)
    await asyncio.wait_for(waiter, timeout=HANG_SECONDS)
    # Idle: returns at once (were it to wait, nothing would end it).
    await asyncio.wait_for(in_flight.wait_idle(ADAPTER), timeout=HANG_SECONDS)
