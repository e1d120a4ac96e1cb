"""``POST /v1/responses`` through the real app over a scripted engine, as the official
``openai`` client calls it over loopback: plain, streamed, with a JSON schema, and a function
tool whose output comes back in a second turn; every answer and event parsed strictly into the
SDK's own types."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from tests.support.responses import WritingEngine, client, strict
from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import (
    TENANT,
    ServeFactory,
    eventually,
    quota_usage,
    sse_events,
)

STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


async def test_a_plain_response_is_the_chat_paths_answer(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine(last_finish_reason="stop")) as served:
        created = await client(served).responses.create(
            model=served.model, input="Say hi", instructions="Be brief.", max_output_tokens=5
        )
        response = strict(created)
        assert response.status == "completed"
        assert len(response.output_text) == 5 and response.output_text.isalpha()
        [message] = response.output
        assert message.type == "message" and message.content[0].type == "output_text"
        usage = response.usage
        assert usage is not None and usage.output_tokens == 5
        assert usage.total_tokens == usage.input_tokens + 5
        # The instructions came first, as a system message, in the prompt the engine ran.
        [request] = served.engine.requests.values()
        prompt = served.engine.tokenizer.decode(request.prompt_token_ids)
        assert prompt.index("Be brief.") < prompt.index("Say hi")
        tenant = served.gateway.registry.tenant(TENANT)
        assert tenant is not None and request.cache_salt == tenant.cache_salt
        # The usage ledger and metrics name the endpoint.
        await served.settled()
        [record] = await served.usage_records()
        assert (record.endpoint, record.completion_tokens) == ("responses", 5)
        assert served.samples("lora_gateway_requests_total", endpoint="responses", status="ok") == 1


async def test_the_quotas_reserve_and_settle_a_response_as_a_chat_completion(
    serve: ServeFactory,
) -> None:
    async with serve(ScriptedEngine(last_finish_reason="stop")) as served:
        await served.set_quota(token_budget=10**6, budget_period="day")
        await client(served).responses.create(model=served.model, input="hi", max_output_tokens=3)
        await served.settled()
        [record] = await served.usage_records()
        used = await quota_usage(served)
        assert used.budget_used == record.prompt_tokens + record.completion_tokens
        assert used.concurrent == 0
        # A worst case past the whole budget is refused before it runs, and holds nothing.
        await served.set_quota(token_budget=50, budget_period="day")
        with pytest.raises(openai.BadRequestError) as refused:
            await client(served).responses.create(
                model=served.model, input="hi", max_output_tokens=500
            )
        assert refused.value.code == "request_too_large"
        await served.settled()
        assert len(served.engine.requests) == 1
        assert len(await served.usage_records()) == 1
        assert (await quota_usage(served)).concurrent == 0


async def test_an_output_cut_at_max_output_tokens_is_incomplete(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine()) as served:  # its last token finishes with "length"
        response = strict(
            await client(served).responses.create(
                model=served.model, input="hi", max_output_tokens=3
            )
        )
        assert response.status == "incomplete"
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
        assert response.output[0].status == "incomplete"  # type: ignore[union-attr]


async def test_a_streamed_response_walks_openais_event_sequence(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine(last_finish_reason="stop")) as served:
        async with client(served).responses.stream(
            model=served.model, input="hi", max_output_tokens=4
        ) as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_response()
        assert kinds == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            *["response.output_text.delta"] * 4,
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
        assert len(strict(final).output_text) == 4
        assert final.usage is not None and final.usage.output_tokens == 4
        # The raw events: numbered from 0 without a gap, each one of the SDK's typed events.
        async with served.client() as http:
            body = {"model": served.model, "input": "hi", "max_output_tokens": 4, "stream": True}
            raw = (await http.post("/v1/responses", json=body)).text
        events = [event for event in sse_events(raw)]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        for event in events:
            STREAM_EVENT.validate_python(event)
        deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        assert events[-1]["response"]["output"][0]["content"][0]["text"] == deltas


async def test_a_stream_that_fails_midway_ends_with_response_failed(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine(fail_after=2)) as served:
        async with served.client() as http:
            body = {"model": served.model, "input": "hi", "max_output_tokens": 8, "stream": True}
            events = sse_events((await http.post("/v1/responses", json=body)).text)
        for event in events:
            STREAM_EVENT.validate_python(event)
        assert events[-1]["type"] == "response.failed"
        assert events[-1]["response"]["status"] == "failed"
        assert events[-1]["response"]["error"]["code"] == "server_error"
        assert "response.completed" not in [e["type"] for e in events]


async def test_a_json_schema_format_constrains_the_output(serve: ServeFactory) -> None:
    engine = WritingEngine('{"city":"Paris"}')
    async with serve(engine) as served:
        schema = {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        }
        response = strict(
            await client(served).responses.create(
                model=served.model,
                input="Where?",
                text={
                    "format": {
                        "type": "json_schema",
                        "name": "place",
                        "schema": schema,
                        "strict": True,
                    }
                },
            )
        )
        assert json.loads(response.output_text) == {"city": "Paris"}
        assert response.text is not None and response.text.format is not None
        assert response.text.format.type == "json_schema"
        [request] = engine.requests.values()
        constraint = request.params.structured_outputs
        assert constraint is not None
        sent = constraint.json
        assert (json.loads(sent) if isinstance(sent, str) else sent) == schema


async def test_a_function_call_and_its_output_in_a_second_turn(serve: ServeFactory) -> None:
    engine = WritingEngine('{"city":"Paris"}')
    async with serve(engine) as served:
        openai_client = client(served)
        first = strict(
            await openai_client.responses.create(
                model=served.model,
                input="Weather in Paris?",
                tools=[WEATHER],  # type: ignore[list-item]
                tool_choice={"type": "function", "name": "get_weather"},
            )
        )
        [call] = first.output
        assert call.type == "function_call"
        assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
        engine.text = "Sunny."
        second = strict(
            await openai_client.responses.create(
                model=served.model,
                previous_response_id=first.id,
                input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18C"}],
            )
        )
        assert second.output_text == "Sunny." and second.previous_response_id == first.id
        # The second turn's prompt holds the whole chain: the question, the call, its output.
        prompt = engine.tokenizer.decode(list(engine.requests.values())[-1].prompt_token_ids)
        assert prompt.index("Weather in Paris?") < prompt.index("get_weather") < prompt.index("18C")


async def test_a_streamed_function_call(serve: ServeFactory) -> None:
    async with serve(WritingEngine('{"city":"Oslo"}')) as served:
        async with client(served).responses.stream(
            model=served.model,
            input="Weather in Oslo?",
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice={"type": "function", "name": "get_weather"},
        ) as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_response()
        assert kinds[:3] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
        ]
        assert "response.function_call_arguments.delta" in kinds
        assert kinds[-3:] == [
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
        [call] = strict(final).output
        assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Oslo"}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("reasoning", {"effort": "high"}),
        ("conversation", "conv_1"),
        ("prompt", {"id": "pmpt_1"}),
        ("include", ["file_search_call.results"]),
        ("tools", [{"type": "web_search"}]),
        ("tools", [{"type": "file_search", "vector_store_ids": ["vs_1"]}]),
        ("input", [{"type": "message", "role": "user", "content": [{"type": "input_image"}]}]),
        ("input", [{"type": "reasoning", "summary": []}]),
        ("text", {"format": {"type": "json_schema", "schema": {}}}),
    ],
)
async def test_what_is_not_served_is_refused_naming_the_field(
    serve: ServeFactory, field: str, value: Any
) -> None:
    async with serve(ScriptedEngine()) as served:
        async with served.client() as http:
            body = {"model": served.model, "input": "hi", field: value}
            answer = await http.post("/v1/responses", json=body)
        assert answer.status_code == 400
        assert answer.json()["error"]["param"].startswith(field)
        assert not served.engine.requests
        await served.settled()
        assert await served.usage_records() == []


async def test_a_client_that_leaves_a_stream_stops_the_engine_and_is_settled(
    serve: ServeFactory,
) -> None:
    engine = ScriptedEngine(step_seconds=0.05)
    async with serve(engine) as served:
        await served.set_quota(token_budget=10**6, budget_period="day")
        body = {"model": served.model, "input": "hi", "max_output_tokens": 500, "stream": True}
        async with served.client() as http, http.stream("POST", "/v1/responses", json=body) as s:
            async for line in s.aiter_lines():
                if "response.output_text.delta" in line:
                    break
        await eventually(lambda: bool(engine.aborted))
        await served.settled()
        [record] = await served.usage_records()
        assert record.status == "cancelled" and 0 < record.completion_tokens < 500
        used = await quota_usage(served)
        assert used.budget_used == record.prompt_tokens + record.completion_tokens
        assert used.concurrent == 0
        # A response cut off by its client is not stored (its id is the request's).
        stored = await served.gateway.responses.get(
            served.gateway.registry.tenant(TENANT).uid,  # type: ignore[union-attr]
            f"resp_{record.request_id}",
        )
        assert stored is None
