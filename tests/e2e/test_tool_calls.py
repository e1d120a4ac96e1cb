"""Tool calls on the real engine through the official client: a named call's arguments
validate against its parameters (whole, and reassembled from a stream), ``required`` picks
one of two tools with valid arguments, and a history of calls and results is answered, for
the base model and an adapter."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from tests.support.live_gateway import LiveGateway

pytestmark = pytest.mark.slow

BASE = "SmolLM2-135M-Instruct"
MODELS = [BASE, "legal_advisor"]
WEATHER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "maxLength": 32}},
    "required": ["timezone"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": WEATHER_PARAMETERS,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The current time in a timezone",
            "parameters": TIME_PARAMETERS,
        },
    },
]
PARAMETERS = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME_PARAMETERS}
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}
MESSAGES: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.mark.parametrize("model", MODELS)
def test_a_named_call_has_arguments_valid_for_its_parameters(
    gateway: LiveGateway, model: str
) -> None:
    response = gateway.client("demo-all").chat.completions.create(
        model=model, messages=MESSAGES, tools=TOOLS, tool_choice=NAMED, temperature=0, max_tokens=80
    )
    choice = response.choices[0]
    assert choice.finish_reason == "stop", choice
    assert choice.message.content is None
    [call] = choice.message.tool_calls or []
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMETERS)


@pytest.mark.parametrize("model", MODELS)
async def test_a_streamed_named_call_reassembles_to_valid_arguments(
    gateway: LiveGateway, model: str
) -> None:
    stream = await gateway.async_client("demo-all").chat.completions.create(
        model=model,
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice=NAMED,
        temperature=0.8,
        seed=3,
        max_tokens=80,
        stream=True,
    )
    ids, names, arguments, finishes = set(), [], [], []
    async for chunk in stream:
        choice = chunk.choices[0]
        finishes.append(choice.finish_reason)
        for piece in choice.delta.tool_calls or []:
            assert piece.index == 0
            if piece.id is not None:
                ids.add(piece.id)
            if piece.function is not None:
                names.append(piece.function.name)
                arguments.append(piece.function.arguments or "")
    assert finishes[-1] == "stop" and len(ids) == 1
    assert [name for name in names if name] == ["get_weather"]
    jsonschema.validate(json.loads("".join(arguments)), WEATHER_PARAMETERS)


@pytest.mark.parametrize("model", MODELS)
def test_required_picks_one_of_the_tools_with_valid_arguments(
    gateway: LiveGateway, model: str
) -> None:
    response = gateway.client("demo-all").chat.completions.create(
        model=model,
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=120,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls or []
    assert call.function.name in PARAMETERS
    jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])


@pytest.mark.parametrize("model", MODELS)
def test_a_history_of_calls_and_results_is_answered(gateway: LiveGateway, model: str) -> None:
    history: list[Any] = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city":"Paris","unit":"celsius"}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"},
    ]
    response = gateway.client("demo-all").chat.completions.create(
        model=model, messages=history, tools=TOOLS, tool_choice="none", max_tokens=24
    )
    choice = response.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert choice.message.tool_calls is None and choice.message.content
    assert response.usage is not None and response.usage.prompt_tokens > 60
