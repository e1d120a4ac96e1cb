"""The closed-loop client against a tiny streaming server: at most ``concurrency``
requests at once, every request recorded, TTFT at the first content chunk (not the
role chunk), a cycling flood stopped by hanging up, refusals honoured."""

from __future__ import annotations

import asyncio

from bench.client import Call, ClosedLoop, run_closed_loop
from bench.workload import PlannedRequest
from tests.bench.stream_server import serving


def requests(count: int) -> list[PlannedRequest]:
    return [PlannedRequest(i, 0.0, i % 3, None, "hi", 2) for i in range(count)]


def call(_: PlannedRequest) -> Call:
    return Call("base", None)


async def test_closed_loop_holds_its_concurrency_and_records_every_request() -> None:
    async for server, url in serving(0.02):
        records, wall = await run_closed_loop(
            url, "s", "p", requests(9), call, concurrency=3, timeout_seconds=30
        )
        assert server.most_open == 3 and server.served == 9
        assert [r.index for r in records] == list(range(9))
        assert all(r.ok and r.output_tokens == 2 for r in records)
        # TTFT: the first token after one delay; the role chunk came at once.
        assert all(r.ttft is not None and r.ttft >= 0.02 for r in records)
        assert wall >= 3 * 0.04  # three waves of two tokens


async def test_a_cycling_loop_runs_until_stopped_and_hangs_up() -> None:
    async for server, url in serving(0.05):
        loop = ClosedLoop(url, "s", "flood", requests(2), call, concurrency=4, cycle=True)
        loop.start()
        # It keeps going past the two planned requests: a fifth is sent (records are made as
        # requests go out) once one of the first four has ended. Waited for, where half a
        # second could pass on a busy machine before any had ended; a loop that stopped at
        # two would never get there (a minute bounds the wait).
        async with asyncio.timeout(60):
            while len(loop.records) <= 4:
                await asyncio.sleep(0.01)
        await loop.stop()
        assert any(r.error == ClosedLoop.CANCELLED for r in loop.records)
        # The server sees the hang-up at its next write (a token every 0.05 s).
        async with asyncio.timeout(60):  # bounds a hang only
            while server.open:
                await asyncio.sleep(0.05)


async def test_a_deadline_records_what_never_ran() -> None:
    async for _, url in serving(0.5):
        records, _ = await run_closed_loop(
            url, "s", "p", requests(3), call, concurrency=1, timeout_seconds=0.3
        )
        assert len(records) == 3 and not any(r.ok for r in records)
        assert records[0].error == "not finished before the deadline"
        assert records[2].error == "not sent before the deadline"


async def test_a_refused_client_waits_for_retry_after() -> None:
    async for server, url in serving(0.0, refuse=True):
        loop = ClosedLoop(url, "s", "flood", requests(2), call, concurrency=1, cycle=True)
        loop.start()
        await asyncio.sleep(0.5)
        await loop.stop()
        # Every 0.2 s at most, not as fast as the refusals come back (a loaded machine may
        # serve fewer, never more).
        assert 1 <= server.served <= 4
        assert all(r.status == 429 and r.retry_after == 0.2 for r in loop.records)
