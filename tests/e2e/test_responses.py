"""The Responses API on the real engine, through the official client: a plain create on an
adapter, and a streamed create continuing it (``previous_response_id``), walked by the SDK's
stream helper; a ``json_schema`` format; a forced function call answered in a second turn
through the chain; its input items listed, and the response deleted; background responses
polled to their end, and cancelled. Every answer parses strictly into the SDK's types."""

from __future__ import annotations

import json
import time
from typing import Any

import openai
import pytest
from openai.types.responses import Response

from tests.support.live_gateway import LiveGateway
from tests.support.responses import strict

pytestmark = pytest.mark.slow


def test_a_plain_and_a_streamed_response_on_an_adapter(gateway: LiveGateway) -> None:
    client = gateway.client("demo-all")
    raw = client.responses.with_raw_response.create(
        model="medical_scribe",
        instructions="Answer in one short sentence.",
        input="What is a fever?",
        max_output_tokens=12,
        temperature=0,
    )
    first = Response.model_validate(raw.parse().to_dict())
    assert raw.headers["x-adapter-version"]
    assert first.status in ("completed", "incomplete") and first.output_text
    assert first.usage is not None and 0 < first.usage.output_tokens <= 12

    with client.responses.stream(
        model="medical_scribe",
        input="And a cough?",
        previous_response_id=first.id,
        max_output_tokens=12,
        temperature=0,
    ) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert kinds[-1] in ("response.completed", "response.incomplete")
    second = Response.model_validate(events[-1].response.to_dict())  # type: ignore[union-attr]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert second.output_text == deltas and second.previous_response_id == first.id
    # The chain's first turn came back to the engine in the second's prompt.
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert client.responses.retrieve(second.id).id == second.id


WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 24}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
VERDICT: Any = {
    "type": "json_schema",
    "name": "verdict",
    "schema": {
        "type": "object",
        "properties": {"urgent": {"type": "boolean"}},
        "required": ["urgent"],
        "additionalProperties": False,
    },
    "strict": True,
}


def test_a_schema_a_tool_call_answered_through_the_chain_listed_and_deleted(
    gateway: LiveGateway,
) -> None:
    client = gateway.client("demo-all")
    shaped = client.responses.create(
        model="medical_scribe",
        input="Is a fever urgent?",
        text={"format": VERDICT},
        max_output_tokens=24,
    )
    assert strict(shaped).status == "completed"
    assert isinstance(json.loads(shaped.output_text)["urgent"], bool)

    asked = client.responses.create(
        model="medical_scribe",
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=40,
    )
    [call] = strict(asked).output
    assert call.type == "function_call" and call.name == "get_weather"
    assert isinstance(json.loads(call.arguments)["city"], str)

    # The second turn sends the call's output alone: the call comes from the chain.
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "18C, sunny"}
    answered = client.responses.create(
        model="medical_scribe",
        input=[output],
        previous_response_id=asked.id,
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=8,
    )
    assert [item.type for item in strict(answered).output] == ["message"]
    assert answered.usage is not None and asked.usage is not None
    assert answered.usage.input_tokens > asked.usage.input_tokens

    [listed] = client.responses.input_items.list(answered.id).data
    assert (listed.type, listed.call_id, listed.output) == (  # type: ignore[union-attr]
        "function_call_output",
        call.call_id,
        "18C, sunny",
    )
    assert client.responses.delete(answered.id) is None
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(answered.id)


def test_background_responses_polled_to_their_end_and_cancelled(gateway: LiveGateway) -> None:
    client = gateway.client("demo-all")
    queued = client.responses.create(
        model="medical_scribe", input="What is a fever?", max_output_tokens=4, background=True
    )
    assert strict(queued).status == "queued" and queued.background
    deadline = time.monotonic() + 60  # bounds only a hang
    done = queued
    while done.status in ("queued", "in_progress"):
        assert time.monotonic() < deadline, done
        time.sleep(0.1)
        done = client.responses.retrieve(queued.id)
    assert strict(done).status in ("completed", "incomplete") and done.output_text
    assert done.usage is not None and 0 < done.usage.output_tokens <= 4

    running = client.responses.create(
        model="medical_scribe", input="Tell me about fevers.", max_output_tokens=900,
        background=True,
    )  # fmt: skip
    cancelled = client.responses.cancel(running.id)
    assert strict(cancelled).status == "cancelled"
    assert client.responses.retrieve(running.id).status == "cancelled"
