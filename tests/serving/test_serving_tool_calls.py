"""Tool calls through the real app over an engine that writes a given text: a forced call's
JSON becomes ``tool_calls`` (whole and streamed, in OpenAI's shapes), the constraint reaches
the engine, a cut-short call stays content; ``auto`` is refused before anything is held when
no parser is configured, and read back with the configured one (pythonic, which needs no
special tokens in the toy vocabulary) otherwise."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from vllm import CompletionOutput, RequestOutput

from app.main import create_app
from tests.support.harness import app_settings
from tests.support.scripted_engine import ScriptedEngine, ScriptedRequest
from tests.support.serving import Served, ServeFactory, sse_events

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
ARGUMENTS = '{"city":"Paris"}'


class WritingEngine(ScriptedEngine):
    """Writes ``text`` four characters a step, then finishes with ``finish_reason``."""

    def __init__(self, text: str, finish_reason: str = "stop") -> None:
        super().__init__()
        self.text = text
        self.finish_reason = finish_reason

    async def _produce(self, request: ScriptedRequest) -> None:
        pieces = [self.text[i : i + 4] for i in range(0, len(self.text), 4)]
        for step, piece in enumerate(pieces):
            await asyncio.sleep(0)
            last = step == len(pieces) - 1
            request.produced += 1
            request.finished = last
            choices = [
                CompletionOutput(
                    index=i,
                    text=piece,
                    token_ids=[ord(piece[0])],
                    cumulative_logprob=None,
                    logprobs=None,
                    finish_reason=self.finish_reason if last else None,
                )
                for i in range(request.params.n)
            ]
            request.put(
                RequestOutput(
                    request.request_id,
                    None,
                    request.prompt_token_ids,
                    None,
                    choices,
                    finished=last,
                )
            )


def chat(served: Served, **fields: Any) -> dict[str, Any]:
    return {
        "model": served.model,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER, TIME],
        **fields,
    }


async def test_a_named_call_becomes_tool_calls_and_its_schema_reaches_the_engine(
    serve: ServeFactory,
) -> None:
    engine = WritingEngine(ARGUMENTS)
    async with serve(engine) as served, served.client() as client:
        response = await client.post("/v1/chat/completions", json=chat(served, tool_choice=NAMED))
    assert response.status_code == 200, response.text
    [choice] = response.json()["choices"]
    assert choice["finish_reason"] == "stop"  # OpenAI's answer for a named function
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": ARGUMENTS}
    [request] = engine.requests.values()
    assert request.params.structured_outputs is not None
    assert request.params.structured_outputs.json == WEATHER["function"]["parameters"]
    # The tools are described to the model (the toy template knows none: the fallback).
    prompt = "".join(chr(t) for t in request.prompt_token_ids)
    assert "get_weather" in prompt and "get_time" in prompt


async def test_required_answers_tool_calls_with_each_call_parsed(serve: ServeFactory) -> None:
    output = json.dumps(
        [
            {"name": "get_weather", "parameters": {"city": "Paris"}},
            {"name": "get_time", "parameters": {}},
        ]
    )
    engine = WritingEngine(output)
    async with serve(engine) as served, served.client() as client:
        body = chat(served, tool_choice="required", parallel_tool_calls=False)
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    [choice] = response.json()["choices"]
    assert choice["finish_reason"] == "tool_calls"
    calls = [call["function"] for call in choice["message"]["tool_calls"]]
    assert [c["name"] for c in calls] == ["get_weather", "get_time"]
    assert [json.loads(c["arguments"]) for c in calls] == [{"city": "Paris"}, {}]
    [request] = engine.requests.values()
    assert request.params.structured_outputs is not None
    schema = request.params.structured_outputs.json
    assert isinstance(schema, dict) and schema["maxItems"] == 1 and schema["type"] == "array"


async def test_a_call_cut_short_is_content_that_finished_with_length(serve: ServeFactory) -> None:
    engine = WritingEngine('{"city":"Par', finish_reason="length")
    async with serve(engine) as served, served.client() as client:
        response = await client.post("/v1/chat/completions", json=chat(served, tool_choice=NAMED))
    [choice] = response.json()["choices"]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["tool_calls"] is None
    assert choice["message"]["content"] == '{"city":"Par'


async def test_a_named_call_streams_as_openai_streams_one(serve: ServeFactory) -> None:
    engine = WritingEngine(ARGUMENTS)
    async with serve(engine) as served, served.client() as client:
        body = chat(served, tool_choice=NAMED, stream=True)
        response = await client.post("/v1/chat/completions", json=body)
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    deltas = [event["choices"][0] for event in events[:-1]]
    first = deltas[0]["delta"]["tool_calls"]
    assert first == [
        {
            "index": 0,
            "id": first[0]["id"],
            "type": "function",
            "function": {"name": "get_weather", "arguments": ""},
        }
    ]
    assert first[0]["id"].startswith("call_")
    pieces = [d["delta"]["tool_calls"][0] for d in deltas[1:]]
    assert all(p["index"] == 0 and p["id"] is None for p in pieces)
    assert "".join(p["function"]["arguments"] for p in pieces) == ARGUMENTS
    assert [d["finish_reason"] for d in deltas] == [None] * (len(deltas) - 1) + ["stop"]


async def test_required_streams_whole_calls_once_the_json_is_complete(
    serve: ServeFactory,
) -> None:
    engine = WritingEngine(json.dumps([{"name": "get_time", "parameters": {}}]))
    async with serve(engine) as served, served.client() as client:
        body = chat(served, tool_choice="required", stream=True)
        response = await client.post("/v1/chat/completions", json=body)
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    [opening, last] = [event["choices"][0] for event in events[:-1]]
    assert opening["delta"]["role"] == "assistant" and opening["finish_reason"] is None
    assert last["finish_reason"] == "tool_calls"
    [call] = last["delta"]["tool_calls"]
    assert call["function"] == {"name": "get_time", "arguments": "{}"}


async def test_auto_without_a_parser_is_refused_before_anything_is_held(
    serve: ServeFactory,
) -> None:
    engine = WritingEngine(ARGUMENTS)
    async with serve(engine) as served, served.client() as client:
        for fields in ({}, {"tool_choice": "auto"}):
            response = await client.post("/v1/chat/completions", json=chat(served, **fields))
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == "tool_choice" and "parser" in error["message"]
        records = await served.usage_records()
    assert engine.requests == {} and records == []


async def test_a_history_with_calls_and_results_is_rendered(serve: ServeFactory) -> None:
    engine = WritingEngine("It is 18C.")
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ARGUMENTS},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
    ]
    async with serve(engine) as served, served.client() as client:
        body = chat(served, messages=messages, tool_choice="none")
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "It is 18C."
    [request] = engine.requests.values()
    assert request.params.structured_outputs is None
    prompt = "".join(chr(t) for t in request.prompt_token_ids)
    assert "Result of get_weather (call_1): 18C, sunny" in prompt


PYTHONIC_CALL = '[get_weather(city="Paris"), get_time()]'


async def test_auto_reads_calls_with_the_configured_parser(serve: ServeFactory) -> None:
    engine = WritingEngine(PYTHONIC_CALL)
    async with (
        serve(engine, tool_call_parser="pythonic") as served,
        served.client() as client,
    ):
        for fields in ({}, {"tool_choice": "auto"}):
            response = await client.post("/v1/chat/completions", json=chat(served, **fields))
            assert response.status_code == 200, response.text
            [choice] = response.json()["choices"]
            assert choice["finish_reason"] == "tool_calls"
            assert choice["message"]["content"] is None
            calls = choice["message"]["tool_calls"]
            assert all(call["id"].startswith("call_") for call in calls)
            assert [
                (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls
            ] == [
                ("get_weather", {"city": "Paris"}),
                ("get_time", {}),
            ]
    for request in engine.requests.values():
        # Free decoding, the tools described in the prompt.
        assert request.params.structured_outputs is None
        prompt = "".join(chr(t) for t in request.prompt_token_ids)
        assert "get_weather" in prompt and "get_time" in prompt


async def test_auto_text_is_content_and_a_cut_call_finishes_length(serve: ServeFactory) -> None:
    for text, finish in (("It is sunny.", "stop"), (PYTHONIC_CALL, "length")):
        engine = WritingEngine(text, finish_reason=finish)
        async with (
            serve(engine, tool_call_parser="pythonic") as served,
            served.client() as client,
        ):
            response = await client.post("/v1/chat/completions", json=chat(served))
        [choice] = response.json()["choices"]
        assert choice["finish_reason"] == finish
        assert choice["message"] == {"role": "assistant", "content": text, "tool_calls": None}


async def test_auto_streams_each_choice_whole_once_it_ends(serve: ServeFactory) -> None:
    for text, finish in ((PYTHONIC_CALL, "tool_calls"), ("It is sunny.", "stop")):
        engine = WritingEngine(text)
        async with (
            serve(engine, tool_call_parser="pythonic") as served,
            served.client() as client,
        ):
            body = chat(served, tool_choice="auto", stream=True)
            response = await client.post("/v1/chat/completions", json=body)
        events = sse_events(response.text)
        assert events[-1] == "[DONE]"
        [opening, last] = [event["choices"][0] for event in events[:-1]]
        assert opening["delta"]["role"] == "assistant" and opening["finish_reason"] is None
        assert last["finish_reason"] == finish
        if finish == "stop":
            assert last["delta"]["content"] == text and last["delta"]["tool_calls"] is None
            continue
        assert last["delta"]["content"] is None
        calls = last["delta"]["tool_calls"]
        assert [c["index"] for c in calls] == [0, 1]
        assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
        assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris"}, {}]


async def test_an_unknown_parser_stops_the_gateway_at_startup(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    settings = app_settings(tmp_path, model=str(tiny_model_dir), tool_call_parser="no-such-parser")
    app = create_app(settings)
    with pytest.raises(ValueError, match="unknown tool_call_parser 'no-such-parser'"):
        async with app.router.lifespan_context(app):
            pass
