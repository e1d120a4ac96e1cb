"""Background responses: queued at once, run detached through the chat path (quotas, the
ledger), polled, cancelled (aborted on the engine, settled with what it produced), seen by
their tenant alone, and failed, never left in progress, once the replica running them has
died (its lease expired)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter
from sqlalchemy import select

from app import gateway as gateway_module
from app.serving.responses.background import STOPPED, lease_name
from app.store.leases import Leases
from app.store.responses import StoredResponse
from app.store.tables import LeaseRow
from tests.support.responses import client, other_tenants_key, strict
from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import TENANT, Served, ServeFactory, eventually, quota_usage

STREAM_EVENT: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)


async def polled(served: Served, response_id: str, *statuses: str) -> Any:
    """The response once its status is one of ``statuses``."""
    tenant = client(served)
    while True:
        response = await tenant.responses.retrieve(response_id)
        if response.status in statuses:
            return response


async def leases_held(served: Served) -> list[str]:
    async with served.gateway.sessions() as session:
        return list((await session.scalars(select(LeaseRow.name))).all())


def tenant_uid(served: Served) -> str:
    tenant = served.gateway.registry.tenant(TENANT)
    assert tenant is not None
    return tenant.uid


async def test_a_background_response_runs_detached_and_is_polled(serve: ServeFactory) -> None:
    engine = ScriptedEngine(step_seconds=0.01)
    async with serve(engine) as served:
        await served.set_quota(token_budget=10**6, budget_period="day")
        created = await client(served).responses.create(
            model=served.model, input="hi", max_output_tokens=5, background=True
        )
        assert created.status in ("queued", "in_progress") and created.background is True
        assert created.output == []
        done = strict(await polled(served, created.id, "completed", "incomplete", "failed"))
        assert done.status == "incomplete" and done.background is True  # cut at 5 tokens
        assert len(done.output_text) == 5
        assert done.usage is not None and done.usage.output_tokens == 5
        assert done.created_at == created.created_at
        # Through the chat path: one engine request, settled against the quota, in the ledger.
        assert len(engine.requests) == 1
        await served.settled()
        [record] = await served.usage_records()
        assert (record.endpoint, record.completion_tokens) == ("responses", 5)
        used = await quota_usage(served)
        assert used.budget_used == record.prompt_tokens + record.completion_tokens
        assert used.concurrent == 0
        # It continues a chain, on the version that answered it, like any stored response.
        follow = await client(served).responses.create(
            model=served.model, input="more", max_output_tokens=2, previous_response_id=done.id
        )
        assert follow.status == "incomplete"
        # Its lease was let go: nothing is left for a sweep.
        assert await leases_held(served) == []


async def test_a_background_response_must_be_stored_and_is_not_streamed(
    serve: ServeFactory,
) -> None:
    async with serve(ScriptedEngine()) as served:
        async with served.client() as http:
            for extra in ({"store": False}, {"stream": True}):
                body = {"model": served.model, "input": "hi", "background": True, **extra}
                answer = await http.post("/v1/responses", json=body)
                assert answer.status_code == 400, answer.text
                assert answer.json()["error"]["param"] == "background"
        assert served.engine.requests == {}


async def test_a_refused_background_response_ends_failed_and_holds_nothing(
    serve: ServeFactory,
) -> None:
    async with serve(ScriptedEngine()) as served:
        await served.set_quota(token_budget=50, budget_period="day")
        created = await client(served).responses.create(
            model=served.model, input="hi", max_output_tokens=500, background=True
        )
        failed = strict(await polled(served, created.id, "failed"))
        assert failed.error is not None and failed.error.code == "invalid_prompt"
        assert served.engine.requests == {}
        await served.settled()
        assert await served.usage_records() == []
        assert (await quota_usage(served)).concurrent == 0


async def test_cancel_aborts_on_the_engine_and_settles_what_it_produced(
    serve: ServeFactory,
) -> None:
    engine = ScriptedEngine(step_seconds=0.05)
    async with serve(engine) as served:
        await served.set_quota(token_budget=10**6, budget_period="day")
        tenant = client(served)
        created = await tenant.responses.create(
            model=served.model, input="hi", max_output_tokens=500, background=True
        )
        await polled(served, created.id, "in_progress")
        await eventually(lambda: any(r.produced > 1 for r in engine.requests.values()))
        cancelled = strict(await tenant.responses.cancel(created.id))
        assert cancelled.status == "cancelled"
        assert cancelled.output == [] and cancelled.error is None
        assert cancelled.completed_at is None
        [request_id] = engine.requests
        assert engine.aborted == [request_id]
        assert cancelled.usage is not None and 0 < cancelled.usage.output_tokens < 500
        await served.settled()
        [record] = await served.usage_records()
        assert record.status == "cancelled"
        assert record.completion_tokens == cancelled.usage.output_tokens
        used = await quota_usage(served)
        assert used.budget_used == record.prompt_tokens + record.completion_tokens
        assert used.concurrent == 0
        # Polled, and cancelled again: unchanged.
        assert strict(await tenant.responses.retrieve(created.id)) == cancelled
        assert strict(await tenant.responses.cancel(created.id)) == cancelled

        # A finished one is returned unchanged; a foreground one cannot be cancelled.
        short = await tenant.responses.create(
            model=served.model, input="hi", max_output_tokens=2, background=True
        )
        finished = strict(await polled(served, short.id, "incomplete"))
        assert strict(await tenant.responses.cancel(short.id)) == finished
        foreground = await tenant.responses.create(
            model=served.model, input="hi", max_output_tokens=2
        )
        with pytest.raises(openai.BadRequestError) as refused:
            await tenant.responses.cancel(foreground.id)
        assert refused.value.body == {
            "message": "Cannot cancel a synchronous response.",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }


async def test_a_cancel_on_another_replica_stops_it_where_it_runs(serve: ServeFactory) -> None:
    running, other = ScriptedEngine(step_seconds=0.05), ScriptedEngine()
    fast = {"response_lease_seconds": 0.6}
    async with serve(running, **fast) as first, serve(other, **fast) as second:
        created = await client(first).responses.create(
            model=first.model, input="hi", max_output_tokens=500, background=True
        )
        await polled(first, created.id, "in_progress")
        cancelled = await client(second).responses.cancel(created.id)
        assert cancelled.status == "cancelled"
        # The replica running it notices at its next renewal: it aborts, and settles the usage.
        await eventually(lambda: bool(running.aborted))
        await first.settled()
        [record] = await first.usage_records()
        settled = strict(await polled(second, created.id, "cancelled"))
        while settled.usage is None:
            settled = strict(await client(second).responses.retrieve(created.id))
        assert settled.usage.output_tokens == record.completion_tokens
        assert settled.output == [] and settled.error is None
        assert other.requests == {}


async def test_a_cancel_on_another_replica_after_its_last_token_keeps_no_output(
    serve: ServeFactory,
) -> None:
    # The running replica would notice the cancel only at a renewal, long after the end: its
    # answer finds the row cancelled, and fills in the usage alone.
    running = ScriptedEngine(step_seconds=0.05)
    async with serve(running) as first, serve(ScriptedEngine()) as second:
        created = await client(first).responses.create(
            model=first.model, input="hi", max_output_tokens=10, background=True
        )
        await polled(first, created.id, "in_progress")
        cancelled = await client(second).responses.cancel(created.id)
        assert cancelled.status == "cancelled" and cancelled.usage is None
        await eventually(lambda: all(r.finished for r in running.requests.values()))
        await first.settled()
        [record] = await first.usage_records()
        assert record.completion_tokens == 10 and running.aborted == []
        settled = strict(await polled(second, created.id, "cancelled"))
        async with asyncio.timeout(30):  # bounds only a hang: the usage is never filled in
            while settled.usage is None:
                settled = strict(await client(second).responses.retrieve(created.id))
        assert settled.status == "cancelled"
        assert settled.output == [] and settled.error is None
        assert settled.usage.output_tokens == 10
        assert await leases_held(first) == []


async def test_another_tenants_background_response_is_not_found(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine(step_seconds=0.05)) as served:
        created = await client(served).responses.create(
            model=served.model, input="hi", max_output_tokens=500, background=True
        )
        key = await other_tenants_key(served)
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=served.base_url, headers=headers) as other:
            for method, path in [("GET", "/v1/responses/{}"), ("POST", "/v1/responses/{}/cancel")]:
                answers = []
                for response_id in (created.id, "resp_" + "0" * 32):
                    answer = await other.request(method, path.format(response_id))
                    answers.append((answer.status_code, answer.text.replace(response_id, "ID")))
                assert answers[0] == answers[1] and answers[0][0] == 404, (method, path)
        assert (await client(served).responses.retrieve(created.id)).status != "cancelled"
        await client(served).responses.cancel(created.id)


async def test_a_response_whose_replica_died_is_failed_by_a_sweep(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine(), response_lease_seconds=0.3) as served:
        # A replica that died running it: its row in progress, its lease left to expire.
        dead = Leases(served.gateway.sessions, "dead-replica")
        response_id = "resp_" + "d" * 32
        assert await dead.take(lease_name(response_id), timedelta(milliseconds=1))
        body = {
            "id": response_id,
            "object": "response",
            "created_at": 1,
            "status": "in_progress",
            "model": served.model,
            "output": [],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "text": {"format": {"type": "text"}},
            "store": True,
            "background": True,
            "metadata": {},
        }
        stored = StoredResponse(response_id, served.model, None, None, body, [], [])
        await served.gateway.responses.save(tenant_uid(served), stored)
        failed = strict(await polled(served, response_id, "failed"))
        assert failed.error is not None and failed.error.code == "server_error"
        assert "stopped before it finished" in failed.error.message
        # The sweep lets its lease go after it wrote the failure: seen failed, it may hold it.
        async with asyncio.timeout(60):  # bounds a hang only
            while await leases_held(served):
                await asyncio.sleep(0.01)


async def test_a_replica_that_stops_fails_the_responses_it_still_runs(
    serve: ServeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gateway_module, "BACKGROUND_GRACE_SECONDS", 0.2)
    async with serve(ScriptedEngine()) as other:
        async with serve(ScriptedEngine(step_seconds=0.05)) as stopping:
            created = await client(stopping).responses.create(
                model=stopping.model, input="hi", max_output_tokens=500, background=True
            )
            await polled(stopping, created.id, "in_progress")
        # Stopped within its grace, not died: it wrote the end itself, and let its lease go.
        failed = strict(await polled(other, created.id, "failed"))
        assert failed.error is not None and failed.error.message == STOPPED.message
        assert await leases_held(other) == []


async def typed_events(served: Served, response_id: str, **query: Any) -> list[Any]:
    """The response's stream, read by the SDK into its typed events."""
    stream = await client(served).responses.retrieve(response_id, stream=True, **query)
    events = [event async for event in stream]
    return [STREAM_EVENT.validate_python(event.to_dict()) for event in events]


async def test_a_background_responses_stream_resumes_from_a_sequence_number(
    serve: ServeFactory,
) -> None:
    engine = ScriptedEngine(step_seconds=0.02)
    async with serve(engine) as served:
        created = await client(served).responses.create(
            model=served.model, input="hi", max_output_tokens=30, background=True
        )
        # Read while it runs: the stream waits for it to end.
        events = await typed_events(served, created.id)
        done = strict(await client(served).responses.retrieve(created.id))
        assert done.status == "incomplete"
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert [e.type for e in events] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.incomplete",
        ]
        assert events[0].response.status == "queued"
        assert events[4].delta == done.output_text  # type: ignore[union-attr]
        assert events[-1].response == done  # type: ignore[union-attr]
        # Resumed after any event: the same events, from the next one on.
        for after in (0, 4, 7):
            assert (
                await typed_events(served, created.id, starting_after=after) == events[after + 1 :]
            )
        assert await typed_events(served, created.id, starting_after=8) == []

        # A foreground response has no stream to resume; starting_after needs stream=true.
        foreground = await client(served).responses.create(
            model=served.model, input="hi", max_output_tokens=2
        )
        async with served.client() as http:
            answer = await http.get(f"/v1/responses/{foreground.id}", params={"stream": "true"})
            assert (answer.status_code, answer.json()["error"]["param"]) == (400, "stream")
            answer = await http.get(f"/v1/responses/{created.id}", params={"starting_after": 1})
            assert (answer.status_code, answer.json()["error"]["param"]) == (400, "starting_after")
