"""A streamed Response is written as data (``response_body``), a non-streamed one as the model
(``response``): the two agree field for field and in the model's order, for every request
shape and state, and both are the SDK's ``Response``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response

from app.protocol.responses_api import (
    FunctionCallOutput,
    OutputItem,
    OutputMessage,
    OutputText,
    ResponseError,
    ResponsesRequest,
)
from app.serving.preparation.responses import translate
from app.serving.responses import output

WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
REQUESTS: list[dict[str, Any]] = [
    {"input": "hi"},
    {
        "input": [{"role": "user", "content": "Weather?"}],
        "instructions": "Be brief.",
        "temperature": 1,
        "top_p": 0.5,
        "max_output_tokens": 7,
        "user": "u-1",
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "parallel_tool_calls": False,
        "metadata": {"k": "v"},
        "store": False,
        "previous_response_id": "resp_0",
    },
    {
        "input": "hi",
        "text": {
            "format": {
                "type": "json_schema",
                "name": "answer",
                "schema": {"type": "object"},
                "strict": True,
            }
        },
        "tool_choice": "none",
        "tools": [WEATHER],
    },
    {"input": "hi", "text": {"format": {"type": "json_object"}}, "background": True},
]
STATES: list[tuple[str, str | None, bool]] = [
    ("in_progress", None, False),
    ("completed", "stop", False),
    ("completed", "length", False),
    ("completed", "tool_calls", False),
    ("failed", None, True),
]


@pytest.mark.parametrize("fields", REQUESTS)
@pytest.mark.parametrize(("status", "finish_reason", "with_error"), STATES)
def test_the_body_is_what_the_model_dumps(
    monkeypatch: pytest.MonkeyPatch,
    fields: dict[str, Any],
    status: str,
    finish_reason: str | None,
    with_error: bool,
) -> None:
    monkeypatch.setattr("app.serving.responses.output.time.time", lambda: 1_700_000_000.5)
    request = ResponsesRequest.model_validate({"model": "m", **fields})
    translated = translate(request, [], response_id="resp_1")
    items: list[OutputItem] = [
        OutputMessage(id="msg_1", status="completed", content=[OutputText(text='"hi"\n')]),
        FunctionCallOutput(id="fc_1", call_id="call_1", name="get_weather", arguments="{}"),
    ]
    error = ResponseError(code="server_error", message="stopped") if with_error else None
    model = output.response(
        translated,
        list(items),
        status=status,
        finish_reason=finish_reason,
        token_usage=output.usage(5, 2),
        error=error,
    ).model_dump(mode="json")
    body = output.response_body(
        translated,
        [item.model_dump(mode="json") for item in items],
        status=status,
        finish_reason=finish_reason,
        token_usage=output.usage_body(5, 2),
        error=None if error is None else error.model_dump(),
    )
    assert json.dumps(body) == json.dumps(model)  # the same fields, values and order
    assert Response.model_validate(body).id == "resp_1"


@pytest.mark.parametrize("fields", REQUESTS)
@pytest.mark.parametrize(("status", "finish_reason"), [s[:2] for s in STATES if not s[2]])
def test_the_text_is_what_json_writes_of_the_body(
    monkeypatch: pytest.MonkeyPatch, fields: dict[str, Any], status: str, finish_reason: str | None
) -> None:
    monkeypatch.setattr("app.serving.responses.output.time.time", lambda: 1_700_000_000.5)
    request = ResponsesRequest.model_validate({"model": "m", **fields})
    translated = translate(request, [], response_id="resp_1")
    items = [
        {"id": "msg_1", "type": "message", "content": [{"text": '"hi"\n\u2603'}]},
        {"id": "fc_1", "type": "function_call", "arguments": "{}"},
    ]
    writer = output.ResponseText(translated)
    for usage in (None, (5, 2)):
        body = output.response_body(
            translated,
            items,
            status=status,
            finish_reason=finish_reason,
            token_usage=None if usage is None else output.usage_body(*usage),
        )
        text = writer.write(
            [json.dumps(item) for item in items],
            status=status,
            finish_reason=finish_reason,
            token_usage=None if usage is None else output.usage_json(*usage),
        )
        assert text == json.dumps(body)
    assert writer.write([], status="in_progress") == json.dumps(
        output.response_body(translated, [], status="in_progress")
    )


@pytest.mark.parametrize(
    "value", ["resp_1", '"hi"\n\u2603', "", 0, -7, 2**70, None, True, 0.5, {"a": [1]}]
)
def test_a_value_is_written_as_json_writes_it(value: Any) -> None:
    assert output.json_value(value) == json.dumps(value)
