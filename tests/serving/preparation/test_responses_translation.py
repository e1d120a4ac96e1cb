"""The one translation of a Responses request into the chat request that runs it: the
messages a chain's items stand for, the fields moved to chat's shapes, and refusals that
name the Responses request's own fields."""

from __future__ import annotations

from typing import Any

import pytest

from app.errors import BadRequestError
from app.protocol.responses_api import ResponsesRequest
from app.serving.preparation.responses import responses_param, translate
from app.serving.preparation.structured import OutputConstraints

WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


def request(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", "input": "hi", **fields})


def test_items_become_chat_messages_after_the_instructions() -> None:
    context = translate(request(input="Weather?"), []).input_items
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"}
    continued = translate(
        request(
            instructions="Be brief.",
            input=[
                {"role": "assistant", "content": [{"type": "output_text", "text": "Let me see."}]},
                call,
                {**call, "call_id": "call_2"},
                {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
                {"type": "message", "role": "developer", "content": "Use Celsius."},
            ],
        ),
        context,
    )
    messages = [m.model_dump(exclude_none=True) for m in continued.chat.messages]
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "developer",
    ]
    assert messages[0]["content"] == "Be brief." and messages[1]["content"] == "Weather?"
    # The text and both calls are one assistant turn.
    assert messages[2]["content"] == "Let me see."
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["call_1", "call_2"]
    assert messages[3] == {"role": "tool", "tool_call_id": "call_1", "content": "18C"}
    # Stored with ids, in the shapes input_items lists.
    assert [item["type"] for item in continued.input_items] == [
        "message",
        "function_call",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert all(item["id"] for item in continued.input_items)


def test_fields_move_to_chats_shapes() -> None:
    chat = translate(
        request(
            max_output_tokens=7,
            temperature=0.3,
            user="alice",
            tools=[WEATHER],
            tool_choice={"type": "function", "name": "get_weather"},
            parallel_tool_calls=False,
            stream=True,
        ),
        [],
    ).chat
    assert chat.max_completion_tokens == 7 and chat.temperature == 0.3 and chat.user == "alice"
    assert chat.tools is not None and chat.tools[0].function.name == "get_weather"
    assert chat.forced_tool == "get_weather" and not chat.parallel_tool_calls
    assert chat.stream and chat.include_usage
    # A background response runs as a stream, counted as it goes (a cancel charges that).
    background = translate(request(background=True), []).chat
    assert background.stream and background.include_usage
    assert not translate(request(), []).chat.stream
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    formatted = translate(
        request(text={"format": {"type": "json_schema", "name": "x", "schema": schema}}), []
    ).chat
    assert formatted.response_format is not None
    assert formatted.response_format.json_schema is not None
    assert formatted.response_format.json_schema.json_schema == schema
    as_object = translate(request(text={"format": {"type": "json_object"}}), []).chat
    assert as_object.response_format is not None and as_object.response_format.type == "json_object"
    constraint = OutputConstraints().constraint(as_object)
    assert constraint is not None and constraint.params.json_object is True
    plain = translate(request(text={"format": {"type": "text"}}), []).chat
    assert OutputConstraints().constraint(plain) is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": []}, "input"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice"),
    ],
)
def test_a_refusal_names_the_responses_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequestError) as refused:
        translate(request(**fields), [])
    assert refused.value.param == param


def test_chat_params_are_named_as_a_responses_client_knows_them() -> None:
    assert responses_param("messages") == "input"
    assert responses_param("max_tokens") == "max_output_tokens"
    assert responses_param("response_format.json_schema.schema") == "text.format.schema"
    assert responses_param("tools.0.function.parameters") == "tools.0.parameters"
    assert responses_param("tool_choice") == "tool_choice"
