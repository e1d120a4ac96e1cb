"""Tool calling without an engine: what the protocol accepts and refuses, the schema a
forced call is decoded under, reading calls back, and the fallback rendering with the
embedded SmolLM2's own template (which knows no tools)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError
from transformers import AutoTokenizer

from app.protocol import ChatCompletionRequest
from app.serving.preparation import tools
from app.serving.preparation.structured import OutputConstraints
from app.settings import Settings

MODEL_DIR = Path(__file__).parents[3] / "models" / "SmolLM2-135M-Instruct"
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Now"}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
]


def request(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return ChatCompletionRequest.model_validate(body)


def refused_param(**fields: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        request(**fields)
    return ".".join(str(part) for part in caught.value.errors()[0]["loc"])


def test_forced_calls_none_and_a_history_are_accepted() -> None:
    assert request(tools=[WEATHER], tool_choice=NAMED).forced_tool == "get_weather"
    assert request(tools=[WEATHER, TIME], tool_choice="required").forced_tool == "required"
    assert request(tools=[WEATHER], tool_choice="none").forced_tool is None
    assert request(tool_choice="none", parallel_tool_calls=True).forced_tool is None
    assert request(messages=HISTORY).messages[2].tool_call_id == "call_1"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ({"tools": [WEATHER, WEATHER], "tool_choice": "required"}, "tools"),
        (
            {"tools": [{"type": "function", "function": {"name": "a b"}}], "tool_choice": "none"},
            "tools.0.function.name",
        ),
        ({"tools": [{"type": "retrieval"}], "tool_choice": "none"}, "tools.0.type"),
        (
            {"tools": [WEATHER], "tool_choice": NAMED, "response_format": {"type": "json_object"}},
            "tool_choice",
        ),
        (
            {"tools": [WEATHER], "tool_choice": "none", "parallel_tool_calls": "yes"},
            "parallel_tool_calls",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.tool_call_id"),
        (
            {
                "messages": [
                    {"role": "user", "content": "x", "tool_calls": HISTORY[1]["tool_calls"]}
                ]
            },
            "messages.0.tool_calls",
        ),
        ({"messages": [{"role": "function", "name": "f", "content": "x"}]}, "messages.0.role"),
    ],
)
def test_bad_tool_requests_are_refused_naming_the_field(fields: dict[str, Any], param: str) -> None:
    assert refused_param(**fields) == param


def test_auto_is_the_default_with_tools_and_leaves_decoding_free() -> None:
    assert request(tools=[WEATHER]).auto_tools
    assert request(tools=[WEATHER], tool_choice="auto").auto_tools
    assert not request(tools=[WEATHER], tool_choice="none").auto_tools
    assert not request(tools=[WEATHER], tool_choice="required").auto_tools
    assert not request().auto_tools
    chat = request(tools=[WEATHER], tool_choice="auto", response_format={"type": "json_object"})
    assert tools.forced_call_schema(chat) is None


def test_an_unknown_parser_name_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown tool_call_parser 'nope'.*hermes.*pythonic"):
        tools.tool_parser_class("nope")
    assert tools.tool_parser_class("pythonic").__name__ == "PythonicToolParser"
    # The setting itself takes any name: looking it up imports vLLM, done when the gateway
    # starts (tests/serving checks that an unknown one stops it there).
    assert Settings(_env_file=None, tool_call_parser="nope").tool_call_parser == "nope"  # type: ignore[call-arg]


def test_the_pythonic_parser_reads_calls_and_leaves_text_alone() -> None:
    auto = tools.AutoCalls(tools.tool_parser_class("pythonic"), None, request(tools=[WEATHER]))
    found = auto.read('[get_weather(city="Paris"), get_weather(city="Rome")]')
    assert found is not None
    content, calls = found
    assert content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Rome"}),
    ]
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id
    assert auto.read("It is sunny in Paris.") is None
    assert auto.read("[get_weather(city=") is None
    assert auto.skip_special_tokens


def test_the_hermes_parser_keeps_the_text_before_a_call(smollm2: Any) -> None:
    auto = tools.AutoCalls(tools.tool_parser_class("hermes"), smollm2, request(tools=[WEATHER]))
    call_json = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    text = f"Let me check.<tool_call>{call_json}</tool_call>"
    found = auto.read(text)
    assert found is not None
    content, [call] = found
    assert content == "Let me check."
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    # <tool_call> is a special token in hermes-style models: the engine must keep it.
    assert not auto.skip_special_tokens


def test_a_named_function_is_decoded_under_its_parameters() -> None:
    assert tools.forced_call_schema(request(tools=[WEATHER, TIME], tool_choice=NAMED)) == PARAMETERS
    no_parameters = {"type": "function", "function": {"name": "get_time"}}
    named_time = {"type": "function", "function": {"name": "get_time"}}
    schema = tools.forced_call_schema(request(tools=[no_parameters], tool_choice=named_time))
    assert schema == {"type": "object", "properties": {}}
    assert tools.forced_call_schema(request(tools=[WEATHER], tool_choice="none")) is None


def test_required_is_an_array_of_named_calls_as_vllm_builds_it() -> None:
    schema = tools.forced_call_schema(request(tools=[WEATHER, TIME], tool_choice="required"))
    assert schema is not None and "maxItems" not in schema
    jsonschema.Draft202012Validator.check_schema(schema)
    good = [
        {"name": "get_weather", "parameters": {"city": "Paris"}},
        {"name": "get_time", "parameters": {}},
    ]
    jsonschema.validate(good, schema)
    for bad in (
        [],
        [{"name": "other", "parameters": {}}],
        [{"name": "get_weather", "parameters": {}}],
        [{"name": "get_time", "parameters": {}, "value": "25.5"}],
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    single = tools.forced_call_schema(
        request(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)
    )
    assert single is not None and single["maxItems"] == 1
    constraint = OutputConstraints().constraint(request(tools=[WEATHER], tool_choice="required"))
    assert constraint is not None
    params = constraint.params
    assert params is not None and params.json == tools.forced_call_schema(
        request(tools=[WEATHER], tool_choice="required")
    )


def test_calls_are_read_back_only_from_complete_json() -> None:
    named = request(tools=[WEATHER], tool_choice=NAMED)
    [call] = tools.read_calls(named, '{"city":"Paris"}') or []
    assert call.function.name == "get_weather" and call.function.arguments == '{"city":"Paris"}'
    assert call.id.startswith("call_")
    assert tools.read_calls(named, '{"city":"Par') is None
    assert tools.read_calls(named, "[1]") is None
    required = request(tools=[WEATHER, TIME], tool_choice="required")
    calls = tools.read_calls(required, '[{"name":"get_time","parameters":{}}]') or []
    assert [(c.function.name, c.function.arguments) for c in calls] == [("get_time", "{}")]
    assert tools.read_calls(required, "[]") is None
    assert tools.read_calls(required, '{"name":"get_time"}') is None


@pytest.fixture(scope="module")
def smollm2() -> Any:
    return AutoTokenizer.from_pretrained(MODEL_DIR)


def test_smollm2_template_fails_on_a_call_so_the_fallback_renders_it(smollm2: Any) -> None:
    # The reason for the fallback: the model's own template cannot render this history.
    chat = request(messages=HISTORY, tools=[WEATHER, TIME], tool_choice="none")
    native = tools.native_messages(chat.messages)
    try:
        own = smollm2.apply_chat_template(native, tools=[WEATHER], tokenize=False)
    except Exception:
        own = ""
    assert "get_weather" not in own or "Paris" not in own
    prompt = tools.render_prompt(smollm2, chat)
    system, rest = prompt.split("<|im_end|>", 1)
    assert system.startswith("<|im_start|>system\n") and tools.FALLBACK_PREAMBLE in system
    described = [json.loads(line) for line in system.splitlines() if line.startswith("{")]
    assert described == [WEATHER, TIME]
    assert '"name": "get_weather", "arguments": {"city": "Paris"}' in rest
    assert "<|im_start|>user\nResult of get_weather (call_1): 18C, sunny<|im_end|>" in rest
    assert prompt.endswith("<|im_start|>assistant\n")


def test_a_system_message_keeps_its_text_and_gains_the_tools(smollm2: Any) -> None:
    messages = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    prompt = tools.render_prompt(
        smollm2, request(messages=messages, tools=[TIME], tool_choice="none")
    )
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n" + tools.FALLBACK_PREAMBLE)
    assert prompt.count("<|im_start|>system") == 1


def test_without_tools_the_prompt_is_the_models_own(smollm2: Any) -> None:
    plain = [{"role": "user", "content": "hi"}]
    expected = smollm2.apply_chat_template(plain, add_generation_prompt=True, tokenize=False)
    assert tools.render_prompt(smollm2, request()) == expected


class ToolAwareTokenizer:
    """A template that renders tools, calls and results itself: used as it is."""

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        return json.dumps({"messages": messages, "tools": kwargs.get("tools")})


def test_a_template_that_knows_tools_is_used_as_it_is() -> None:
    chat = request(messages=HISTORY, tools=[WEATHER], tool_choice="none")
    rendered = json.loads(tools.render_prompt(ToolAwareTokenizer(), chat))
    assert rendered["tools"] == [WEATHER]
    assert rendered["messages"][1]["content"] is None
    assert rendered["messages"][2] == {
        "role": "tool",
        "content": "18C, sunny",
        "tool_call_id": "call_1",
    }


def test_content_parts_render_as_their_text(smollm2: Any) -> None:
    parts = [{"type": "text", "text": "Weather "}, {"type": "text", "text": "in Paris?"}]
    as_parts = request(messages=[{"role": "user", "content": parts}])
    as_text = request(messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert tools.render_prompt(smollm2, as_parts) == tools.render_prompt(smollm2, as_text)
    with_tools = request(messages=[{"role": "user", "content": parts}], tools=[WEATHER])
    assert "Weather in Paris?" in tools.render_prompt(smollm2, with_tools)
