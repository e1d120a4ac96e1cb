"""Request models: every bad input is refused with a 400 naming the field, never passed on."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import ValidationError
from vllm.v1.serial_utils import MsgpackEncoder

from app.api.errors import install_error_handlers
from app.protocol import (
    INT64_MAX,
    INT64_MIN,
    UNSUPPORTED_FIELDS,
    ChatCompletionRequest,
    CompletionRequest,
)
from app.protocol.requests import TOOL_FIELDS
from app.serving.preparation.generation import sampling_params

MESSAGES = [{"role": "user", "content": "hi"}]
Request = type[ChatCompletionRequest] | type[CompletionRequest]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MESSAGES, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "hi", **fields}


def refusal(model: Request, body: dict[str, Any]) -> tuple[str, str]:
    """The first error's field path (as the 400's ``param`` shows it) and message."""
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    error = caught.value.errors()[0]
    return ".".join(str(part) for part in error["loc"]), error["msg"]


REFUSED: list[tuple[Request, dict[str, Any], str]] = [
    (ChatCompletionRequest, chat(stop=""), "stop"),
    (ChatCompletionRequest, chat(top_k=-2), "top_k"),
    (ChatCompletionRequest, chat(min_p=1.5), "min_p"),
    (CompletionRequest, completion(repetition_penalty=0), "repetition_penalty"),
    (ChatCompletionRequest, chat(stop=[""]), "stop"),
    (ChatCompletionRequest, chat(stop=["END", ""]), "stop"),
    (CompletionRequest, completion(stop=""), "stop"),
    (ChatCompletionRequest, chat(stop=["a", "b", "c", "d", "e"]), "stop"),
    (ChatCompletionRequest, chat(stop=5), "stop"),
    (ChatCompletionRequest, chat(seed=2**64), "seed"),
    (ChatCompletionRequest, chat(seed=INT64_MAX + 1), "seed"),
    (ChatCompletionRequest, chat(seed=INT64_MIN - 1), "seed"),
    (ChatCompletionRequest, chat(max_tokens=2**70), "max_tokens"),
    (ChatCompletionRequest, chat(max_completion_tokens=2**70), "max_completion_tokens"),
    (ChatCompletionRequest, chat(min_tokens=2**70), "min_tokens"),
    (ChatCompletionRequest, chat(stream=True, stream_interval=0), "stream_interval"),
    (CompletionRequest, completion(stream=True, stream_interval=2**70), "stream_interval"),
    (ChatCompletionRequest, chat(n=2**70), "n"),
    (ChatCompletionRequest, chat(n=2, temperature=0), "n"),
    (ChatCompletionRequest, chat(temperature=float("nan")), "temperature"),
    (ChatCompletionRequest, chat(top_p=float("inf")), "top_p"),
    (ChatCompletionRequest, chat(presence_penalty=float("nan")), "presence_penalty"),
    (ChatCompletionRequest, chat(frequency_penalty=float("-inf")), "frequency_penalty"),
    (ChatCompletionRequest, chat(temperature=2**70), "temperature"),
    (ChatCompletionRequest, chat(top_logprobs=3), "top_logprobs"),
    (ChatCompletionRequest, chat(logprobs=True, top_logprobs=2**70), "top_logprobs"),
    (CompletionRequest, completion(logprobs=2**70), "logprobs"),
    (ChatCompletionRequest, chat(user="u" * 257), "user"),
    (
        ChatCompletionRequest,
        chat(messages=[{"role": "tool", "content": "4"}]),
        "messages.0.tool_call_id",
    ),
    (ChatCompletionRequest, chat(messages=[{"role": "function", "name": "f"}]), "messages.0.role"),
    (
        ChatCompletionRequest,
        chat(
            messages=[
                *MESSAGES,
                {"role": "assistant", "tool_calls": [{"id": "1", "type": "function"}]},
            ]
        ),
        "messages.1.tool_calls.0.function",
    ),
    (
        ChatCompletionRequest,
        chat(messages=[{"role": "assistant", "function_call": {"name": "f"}}]),
        "messages.0.function_call",
    ),
    (
        ChatCompletionRequest,
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        "messages.0.content",
    ),
    (ChatCompletionRequest, chat(messages=[{"role": "user", "content": 5}]), "messages.0.content"),
    (
        ChatCompletionRequest,
        chat(messages=[{"role": "user", "content": [{"type": "text"}]}]),
        "messages.0.content",
    ),
    (CompletionRequest, completion(prompt=""), "prompt"),
    (CompletionRequest, completion(prompt=[]), "prompt"),
    (CompletionRequest, completion(prompt=["a", "b"]), "prompt"),
    (CompletionRequest, completion(prompt=[[1, 2]]), "prompt"),
    (CompletionRequest, completion(prompt=[1.5]), "prompt"),
    (CompletionRequest, completion(prompt=[True]), "prompt"),
    (CompletionRequest, completion(prompt=5), "prompt"),
]


@pytest.mark.parametrize(("model", "body", "param"), REFUSED)
def test_bad_values_are_refused_naming_the_field(
    model: Request, body: dict[str, Any], param: str
) -> None:
    assert refusal(model, body)[0] == param


# A value each unsupported field may take that asks for something this server does not do.
ACTIVE_VALUES: dict[str, object] = {
    "functions": [{"name": "f"}],
    "function_call": "auto",
    "audio": {"voice": "alloy", "format": "mp3"},
    "modalities": ["text", "audio"],
    "prediction": {"type": "content", "content": "x"},
    "web_search_options": {},
    "reasoning_effort": "high",
    "verbosity": "low",
    "service_tier": "priority",
    "store": True,
    "metadata": {"team": "a"},
    "best_of": 3,
    "suffix": "}",
}


def test_every_unsupported_field_has_a_test_value() -> None:
    assert set(ACTIVE_VALUES) == set(UNSUPPORTED_FIELDS)


@pytest.mark.parametrize("field", sorted(UNSUPPORTED_FIELDS))
@pytest.mark.parametrize("model", [ChatCompletionRequest, CompletionRequest])
def test_unsupported_fields_are_refused_not_ignored(model: Request, field: str) -> None:
    body = chat if model is ChatCompletionRequest else completion
    param, message = refusal(model, body(**{field: ACTIVE_VALUES[field]}))
    assert param == field and "not supported" in message


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
TOOL_VALUES: dict[str, object] = {
    "tools": TOOLS,
    "tool_choice": "required",
    "parallel_tool_calls": False,
}


def test_tool_fields_are_refused_by_text_completions() -> None:
    assert set(TOOL_VALUES) == set(TOOL_FIELDS)
    for field, value in TOOL_VALUES.items():
        param, message = refusal(CompletionRequest, completion(**{field: value}))
        assert param == field and "not supported" in message


@pytest.mark.parametrize("field", sorted(UNSUPPORTED_FIELDS))
def test_unsupported_fields_are_accepted_when_off(field: str) -> None:
    for off in (None, *UNSUPPORTED_FIELDS[field]):
        ChatCompletionRequest.model_validate(chat(**{field: off}))
        CompletionRequest.model_validate(completion(**{field: off}))


def test_what_sdks_send_by_default_is_accepted() -> None:
    request = ChatCompletionRequest.model_validate(
        chat(
            tools=None,
            tool_choice="none",
            logit_bias={},
            response_format={"type": "text"},
            parallel_tool_calls=True,
            n=None,
            logprobs=None,
            stream=None,
            stop=None,
            user="customer-42",
            metadata={},
            top_p_tail=5,  # another server's extension: ignored, as before
        )
    )
    assert request.n == 1 and request.logprobs is False and request.stream is False
    assert request.user == "customer-42" and request.stop_sequences == []
    request = ChatCompletionRequest.model_validate(
        chat(messages=[*MESSAGES, {"role": "assistant", "content": "x", "tool_calls": []}])
    )
    assert request.messages[1].text() == "x"
    legacy = CompletionRequest.model_validate(completion(best_of=1, suffix=None, echo=None))
    assert legacy.max_tokens == 16 and legacy.echo is False


@pytest.mark.parametrize(
    "body",
    [
        chat(seed=INT64_MAX, n=16, temperature=0.7, stop=["a", "b", "c", "d"], min_tokens=3),
        chat(seed=INT64_MIN, temperature=0, presence_penalty=-2, frequency_penalty=2),
        chat(temperature=2, top_p=1e-9, logprobs=True, top_logprobs=20, max_tokens=50),
        chat(stream=True, stream_interval=INT64_MAX),
    ],
)
def test_accepted_extremes_are_accepted_by_the_engine(body: dict[str, Any]) -> None:
    """vLLM's SamplingParams and its transport (MessagePack) take what validation passes."""
    request = ChatCompletionRequest.model_validate(body)
    params = sampling_params(request, prompt_tokens=5, max_model_len=100)
    assert params.stream_interval == request.stream_interval
    MsgpackEncoder().encode(params)


@pytest.fixture(scope="module")
def client() -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/v1/chat/completions")
    async def create_chat(body: ChatCompletionRequest) -> dict[str, bool]:
        return {"ok": True}

    @app.post("/v1/completions")
    async def create_completion(body: CompletionRequest) -> dict[str, bool]:
        return {"ok": True}

    return TestClient(app, raise_server_exceptions=False)


def _post(client: TestClient, path: str, content: bytes) -> dict[str, Any]:
    response = client.post(path, content=content, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    return dict(error)


HTTP_CASES = [
    ("/v1/chat/completions", json.dumps(chat(stop="")), "stop"),
    ("/v1/chat/completions", json.dumps(chat(stop=[""])), "stop"),
    ("/v1/chat/completions", json.dumps(chat(seed=2**64)), "seed"),
    ("/v1/chat/completions", json.dumps(chat(max_tokens=2**70)), "max_tokens"),
    (
        "/v1/chat/completions",
        json.dumps(chat(response_format={"type": "json_schema"})),
        "response_format.json_schema",
    ),
    ("/v1/chat/completions", json.dumps(chat(logit_bias={"5": 101})), "logit_bias"),
    ("/v1/chat/completions", json.dumps(chat(tool_choice="auto")), None),
    ("/v1/completions", json.dumps(completion(tools=TOOLS)), "tools"),
    ("/v1/chat/completions", json.dumps(chat(top_logprobs=2)), "top_logprobs"),
    ("/v1/completions", json.dumps(completion(best_of=2)), "best_of"),
    ("/v1/completions", json.dumps(completion(prompt=["a"])), "prompt"),
    ("/v1/chat/completions", json.dumps(chat())[:-1] + ', "temperature": NaN}', "temperature"),
    ("/v1/chat/completions", json.dumps(chat())[:-1] + ', "top_p": 1e999}', "top_p"),
]


@pytest.mark.parametrize(("path", "body", "param"), HTTP_CASES)
def test_http_400_names_the_field(
    client: TestClient, path: str, body: str, param: str | None
) -> None:
    error = _post(client, path, body.encode())
    assert error["param"] == (param or "tool_choice")
    assert f"'{error['param']}'" in error["message"]


@pytest.mark.parametrize(
    "content",
    [
        b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
        b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"model": "m", "extra": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"model": "m", "messages": [',
        b"[]",
        b'"text"',
    ],
)
def test_malformed_bodies_are_a_400(client: TestClient, content: bytes) -> None:
    _post(client, "/v1/chat/completions", content)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": MESSAGES * 4097}, "messages"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}] * 4097}]},
            "messages",
        ),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": f"f{i}", "parameters": {}}}
                    for i in range(129)
                ]
            },
            "tools",
        ),
    ],
)
def test_lists_over_their_bound_are_refused_before_their_items_are_validated(
    fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        ChatCompletionRequest.model_validate(chat(**fields))
    (error,) = refused.value.errors()
    assert error["loc"] == (param,)
    assert error["type"] == "too_long"
