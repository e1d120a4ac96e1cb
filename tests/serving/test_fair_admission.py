"""Fair admission over real HTTP, on an engine with a fixed number of seats served first come,
first served, as vLLM's scheduler serves ``max_num_seqs``: one tenant's flood does not hold
up another's request, a client that leaves while queued costs no engine work, a full queue is
a 429 before any byte, a tenant's constrained requests beyond its cap wait in the gateway, and
``scheduler=fcfs`` is the behaviour before the scheduler."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from app.serving.in_process.engine_run import EngineRun
from tests.support.scripted_engine import ScriptedEngine, SeatedEngine
from tests.support.serving import TENANT, Served, ServeFactory, chat, eventually, quota_usage

NEIGHBOUR = "tenant-b"


async def neighbour_client(served: Served) -> httpx.AsyncClient:
    await served.admin(
        "POST", "/tenants", {"id": NEIGHBOUR, "name": "Tenant B", "allow_base_model": True}
    )
    key = (await served.admin("POST", f"/tenants/{NEIGHBOUR}/keys", {"name": "b"}))["key"]
    return httpx.AsyncClient(
        base_url=served.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


async def hold_stream(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    """Open a stream and read it until cancelled."""
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        async for _ in response.aiter_bytes():
            pass


def neighbour_request(engine: SeatedEngine) -> str:
    """The id of the neighbour's request (the flood's ask for more than 5 tokens)."""
    [request] = [r for r in engine.started() if r.params.max_tokens == 5]
    return request.request_id


async def first_content_after(client: httpx.AsyncClient, body: dict[str, Any]) -> float:
    """Seconds from sending ``body`` (a stream) to its first content token."""
    sent = time.monotonic()
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if '"content":"' in line and '"content":""' not in line:
                return time.monotonic() - sent
    raise AssertionError("the stream ended without content")


def flood_limits() -> httpx.Limits:
    return httpx.Limits(max_connections=200, max_keepalive_connections=200)


@pytest.mark.parametrize("scheduler", ["fair", "fcfs"])
async def test_a_neighbours_request_starts_while_a_tenant_floods_the_engine(
    serve: ServeFactory, scheduler: str
) -> None:
    seats = 8
    engine = SeatedEngine(seats, step_seconds=0.01)
    async with serve(engine, max_num_seqs=seats, scheduler=scheduler) as served:
        neighbour = await neighbour_client(served)
        async with served.client(limits=flood_limits()) as flooder, neighbour:
            flood_body = chat(served, max_tokens=3000, stream=True)
            flood = [asyncio.create_task(hold_stream(flooder, flood_body)) for _ in range(100)]
            try:
                await eventually(lambda: engine.running == seats)
                if scheduler == "fcfs":
                    # Every flood request went straight into the engine's own queue: the
                    # neighbour's request waits behind all of them (30 s streams).
                    await eventually(lambda: len(engine.requests) == 100)
                    waiting = asyncio.create_task(
                        first_content_after(neighbour, chat(served, max_tokens=5, stream=True))
                    )
                    await asyncio.sleep(1.0)
                    assert not waiting.done()
                    waiting.cancel()
                    await asyncio.gather(waiting, return_exceptions=True)
                    return
                # The flood waits in the gateway (all of it arrived: waited for, as a loaded
                # machine takes a while to take in 100 requests), filling the engine's seats.
                await eventually(
                    lambda: (
                        served.samples("lora_gateway_scheduler_queue_depth", tenant=TENANT) >= 90
                    )
                )
                assert engine.peak == seats and engine.unseated == []
                await first_content_after(neighbour, chat(served, max_tokens=5, stream=True))
                # Served ahead of the flood's queue (its 30 s streams hold their seats), let in
                # through the headroom and seated on arrival in the engine, in a flood
                # request's seat (paused until a seat frees).
                assert served.samples("lora_gateway_scheduler_queue_depth", tenant=TENANT) >= 90
                assert engine.waited_behind[neighbour_request(engine)] == 0
                [unseated] = engine.unseated
                assert engine.requests[unseated].params.max_tokens == 3000
                assert engine.peak == seats
            finally:
                for task in flood:
                    task.cancel()
                await asyncio.gather(*flood, return_exceptions=True)


async def keep_sending(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    """One client's closed loop: its next request as soon as the last one ended."""
    while True:
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text


@pytest.mark.parametrize(("window", "quick"), [(None, True), (16, False)])
async def test_requests_waiting_inside_the_engine_shrink_the_window_to_what_it_runs(
    serve: ServeFactory, window: int | None, quick: bool
) -> None:
    """The engine's memory holds 4 requests, the tenants' window starts at 16 (max_num_seqs):
    the flood's requests beyond 4 wait inside the engine, first come, first served, where
    they are out of the fair order. The adaptive window shrinks to the 4 the engine runs, so
    the flood waits in the gateway; a window fixed at 16 (``scheduler_window``) leaves it in
    the engine's queue. Either way the neighbour's request goes in through the headroom, and
    is seated at once, in a flood request's seat."""
    seats = 4
    engine = SeatedEngine(seats, step_seconds=0.01)
    settings: dict[str, Any] = {"max_num_seqs": 16}
    if window is not None:
        settings["scheduler_window"] = window
    async with serve(engine, **settings) as served:
        neighbour = await neighbour_client(served)
        async with served.client(limits=flood_limits()) as flooder, neighbour:
            body = chat(served, max_tokens=20)
            flood = [asyncio.create_task(keep_sending(flooder, body)) for _ in range(40)]
            try:
                await eventually(lambda: engine.running == seats)
                if quick:
                    await eventually(
                        lambda: (
                            served.samples("lora_gateway_scheduler_slots", state="window")
                            == seats + 2
                        )
                    )
                    # What the larger window let in drains; then nothing waits in the engine.
                    await eventually(lambda: engine.load().waiting == 0)  # type: ignore[union-attr]
                else:
                    await eventually(lambda: engine.load().waiting >= 8)  # type: ignore[union-attr]
                await asyncio.sleep(0.5)
                await first_content_after(neighbour, chat(served, max_tokens=5, stream=True))
                assert engine.waited_behind[neighbour_request(engine)] == 0
                assert len(engine.unseated) == 1
                if quick:
                    # The flood waits in the gateway.
                    assert served.samples("lora_gateway_scheduler_queue_depth", tenant=TENANT) > 0
                else:
                    # The flood's requests wait in the engine's queue.
                    assert engine.load().waiting >= 8  # type: ignore[union-attr]
                    assert served.samples("lora_gateway_scheduler_slots", state="window") == 18
            finally:
                for task in flood:
                    task.cancel()
                await asyncio.gather(*flood, return_exceptions=True)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_that_leaves_while_queued_costs_no_engine_work(
    serve: ServeFactory, stream: bool
) -> None:
    engine = ScriptedEngine(step_seconds=0.01)
    async with serve(engine, max_num_seqs=2, scheduler_headroom_slots=0) as served:
        await served.set_quota(
            token_budget=1_000_000, budget_period="day", max_concurrent_requests=10
        )
        async with served.client() as client:
            holders = [
                asyncio.create_task(hold_stream(client, chat(served, max_tokens=3000, stream=True)))
                for _ in range(2)
            ]
            await eventually(lambda: len(engine.requests) == 2)
            body = chat(served, max_tokens=3000, stream=stream)
            queued = asyncio.create_task(client.post("/v1/chat/completions", json=body))
            await eventually(
                lambda: served.samples("lora_gateway_scheduler_queue_depth", tenant=TENANT) == 1
            )
            queued.cancel()
            await asyncio.gather(queued, return_exceptions=True)
            await eventually(
                lambda: served.samples("lora_gateway_scheduler_queue_depth", tenant=TENANT) == 0
            )
            await served.settled()
            records = await served.usage_records()
            assert [(r.status, r.completion_tokens) for r in records] == [("cancelled", 0)]
            level = await quota_usage(served)
            assert level.concurrent == 2  # the two holders only
            # The holders' worst cases are still reserved; the one that left paid its prompt.
            prompt = records[0].prompt_tokens
            assert level.budget_used == 2 * (prompt + 3000) + prompt
            # A slot freed later goes to nobody: the request left the queue for good.
            for task in holders:
                task.cancel()
            await asyncio.gather(*holders, return_exceptions=True)
            await eventually(lambda: engine.num_unfinished_requests() == 0)
            await asyncio.sleep(0.1)
            assert len(engine.requests) == 2


async def test_a_full_queue_is_a_429_with_retry_after_that_holds_nothing(
    serve: ServeFactory,
) -> None:
    engine = ScriptedEngine(step_seconds=0.01)
    settings = {"max_num_seqs": 1, "scheduler_headroom_slots": 0, "scheduler_max_queue_depth": 1}
    async with serve(engine, **settings) as served:
        await served.set_quota(max_concurrent_requests=10)
        async with served.client() as client:
            body = chat(served, max_tokens=3000, stream=True)
            tasks = [asyncio.create_task(hold_stream(client, body)) for _ in range(2)]
            await eventually(
                lambda: served.samples("lora_gateway_scheduler_queue_depth", tenant=TENANT) == 1
            )
            for stream in (False, True):
                refused = await client.post(
                    "/v1/chat/completions", json=chat(served, max_tokens=5, stream=stream)
                )
                assert refused.status_code == 429, refused.text
                assert refused.json()["error"]["code"] == "rate_limit_exceeded"
                assert int(refused.headers["retry-after"]) >= 1
            await served.settled()
            assert (await quota_usage(served)).concurrent == 2
            assert len(engine.requests) == 1
            assert (
                served.samples(
                    "lora_gateway_requests_total", tenant=TENANT, status="rate_limit_exceeded"
                )
                == 2
            )
            assert served.samples("lora_gateway_scheduler_rejections_total", reason="queue_full")
            assert await served.usage_records() == []
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.parametrize("headroom", [2, 0])
async def test_a_tenant_alone_fills_the_engines_batch_whatever_the_headroom(
    serve: ServeFactory, headroom: int
) -> None:
    """The headroom costs a tenant alone no seat: it goes in beyond the batch the tenants
    share (docs/scheduling.md, "Headroom")."""
    engine = SeatedEngine(8, step_seconds=0.002)
    settings = {"max_num_seqs": 8, "scheduler_headroom_slots": headroom}
    async with serve(engine, **settings) as served, served.client() as client:
        responses = await asyncio.gather(
            *(
                client.post("/v1/chat/completions", json=chat(served, max_tokens=100))
                for _ in range(24)
            )
        )
    assert all(r.status_code == 200 for r in responses)
    assert engine.peak == 8 and engine.unseated == []


async def test_tenants_share_the_engine_by_their_weights(serve: ServeFactory) -> None:
    """The weight an admin sets reaches the scheduler: with one slot and both tenants
    backlogged, a tenant of weight 3 gets three requests in for each of a tenant of weight 1."""
    engine = ScriptedEngine(step_seconds=0.001)
    settings = {"max_num_seqs": 1, "scheduler_headroom_slots": 0, "scheduler_quantum_tokens": 1}
    async with serve(engine, **settings) as served:
        neighbour = await neighbour_client(served)
        await served.admin("PATCH", f"/tenants/{NEIGHBOUR}", {"weight": 3})
        await eventually(lambda: served.gateway.registry.tenant(NEIGHBOUR).weight == 3)
        async with served.client(limits=flood_limits()) as client, neighbour:
            holder = asyncio.create_task(
                hold_stream(client, chat(served, max_tokens=3000, stream=True))
            )
            await eventually(lambda: len(engine.requests) == 1)
            body = chat(served, max_tokens=20)
            calls = [
                asyncio.create_task(tenant.post("/v1/chat/completions", json=body))
                for _ in range(12)
                for tenant in (client, neighbour)
            ]
            await eventually(
                lambda: served.samples("lora_gateway_scheduler_queue_depth") == len(calls)
            )
            holder.cancel()
            await asyncio.gather(holder, return_exceptions=True)
            responses = await asyncio.gather(*calls)
        assert all(r.status_code == 200 for r in responses)
        # Salted per tenant: the engine tells whose request each was.
        salts = {t: served.gateway.registry.tenant(t).cache_salt for t in (TENANT, NEIGHBOUR)}
        whose = {salt: tenant for tenant, salt in salts.items()}
        order = [whose[r.cache_salt] for r in engine.started()[1:]]
        first = order[:12]
        assert first.count(NEIGHBOUR) == 9, order


async def test_the_slot_goes_back_as_the_engine_ends_the_request(
    serve: ServeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one seat, the next request enters the engine while the last one's run is still
    closing (its answer on its way, its settlement not done)."""
    closing = asyncio.Event()
    may_close = asyncio.Event()
    close = EngineRun.close

    async def slow_close(run: EngineRun) -> None:
        closing.set()
        await may_close.wait()
        await close(run)

    monkeypatch.setattr(EngineRun, "close", slow_close)
    engine = ScriptedEngine(step_seconds=0.01)
    served_gateway = serve(engine, max_num_seqs=1, scheduler_headroom_slots=0)
    async with served_gateway as served, served.client() as client:
        body = chat(served, max_tokens=3, stream=True)
        first = asyncio.create_task(client.post("/v1/chat/completions", json=body))
        await asyncio.wait_for(closing.wait(), 10)
        second = asyncio.create_task(client.post("/v1/chat/completions", json=body))
        try:
            await eventually(lambda: len(engine.requests) == 2)
        finally:
            may_close.set()
        assert [(await first).status_code, (await second).status_code] == [200, 200]


async def test_a_tenants_second_constrained_request_waits_for_its_first(
    serve: ServeFactory,
) -> None:
    """The output constraint reaches the scheduler: with a cap of one, while one of the
    tenant's constrained requests runs, its next waits in the gateway, and its free-text
    request goes past it."""
    engine = ScriptedEngine(step_seconds=0.01)
    constraint = {"structured_outputs": {"choice": ["yes", "no"]}}
    cap = {"scheduler_max_constrained_per_tenant": 1}
    async with serve(engine, **cap) as served, served.client() as client:
        body = chat(served, max_tokens=3000, stream=True, **constraint)
        holder = asyncio.create_task(hold_stream(client, body))
        await eventually(lambda: len(engine.requests) == 1)
        body = chat(served, max_tokens=3, **constraint)
        held = asyncio.create_task(client.post("/v1/chat/completions", json=body))
        await eventually(
            lambda: served.samples("lora_gateway_scheduler_queue_depth", tenant=TENANT) == 1
        )
        free = await client.post("/v1/chat/completions", json=chat(served, max_tokens=3))
        assert free.status_code == 200, free.text
        assert not held.done() and len(engine.requests) == 2
        holder.cancel()
        await asyncio.gather(holder, return_exceptions=True)
        response = await held
        assert response.status_code == 200, response.text
