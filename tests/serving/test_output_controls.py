"""response_format, logit_bias and user through the real app over a scripted engine: what
reaches the engine, what is refused before anything is held, and what the ledger records."""

from __future__ import annotations

from typing import Any

from tests.support.scripted_engine import VOCABULARY, ScriptedEngine
from tests.support.serving import Served, ServeFactory, quota_usage

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def chat(served: Served, **fields: Any) -> dict[str, Any]:
    return {"model": served.model, "messages": [{"role": "user", "content": "hi"}], **fields}


def json_schema(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}


async def test_the_user_and_how_the_request_went_are_recorded_in_the_ledger(
    serve: ServeFactory,
) -> None:
    async with serve(ScriptedEngine()) as served, served.client() as client:
        body = chat(served, user="end-user-7", max_tokens=2)
        named = await client.post("/v1/chat/completions", json=body)
        anonymous = await client.post(
            "/v1/completions", json={"model": served.model, "prompt": "x", "max_tokens": 2}
        )
        assert named.status_code == anonymous.status_code == 200
        records = await served.usage_records()
    assert [(r.endpoint, r.user) for r in records] == [
        ("chat.completions", "end-user-7"),
        ("completions", None),
    ]
    for record in records:
        assert record.finish_reason == "length"
        assert record.ttft_ms is not None and 0 <= record.ttft_ms <= record.latency_ms
        assert record.itl_ms is not None and record.itl_ms >= 0


async def test_constraints_and_biases_reach_the_engine(serve: ServeFactory) -> None:
    engine = ScriptedEngine()
    async with serve(engine) as served, served.client() as client:
        body = chat(
            served,
            max_tokens=3,
            logit_bias={"7": 100},
            response_format=json_schema(SCHEMA),
        )
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
    [request] = engine.requests.values()
    assert request.params.logit_bias == {7: 100.0}
    assert request.params.structured_outputs is not None
    assert request.params.structured_outputs.json == SCHEMA


async def test_refusals_name_the_field_and_reach_no_engine(serve: ServeFactory) -> None:
    engine = ScriptedEngine()
    cases = [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": {"type": 5}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"logit_bias": {str(VOCABULARY): 1}}, "logit_bias"),
        ({"logit_bias": {"1": 500}}, "logit_bias"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice"),
    ]
    async with serve(engine, max_json_schema_depth=2) as served, served.client() as client:
        for fields, param in cases:
            response = await client.post("/v1/chat/completions", json=chat(served, **fields))
            assert response.status_code == 400, response.text
            assert response.json()["error"]["param"] == param
        deep = {"type": "object", "properties": {"a": {"type": "array", "items": {}}}}
        body = chat(
            served,
            response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": deep}},
        )
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (
            error["param"] == "response_format.json_schema.schema"
            and "at most 2" in error["message"]
        )
    assert engine.requests == {}


async def test_a_stream_interval_past_the_limit_is_refused_and_holds_nothing(
    serve: ServeFactory,
) -> None:
    """Streamed or not (an in-process answer gathers its outputs in chunks too)."""
    engine = ScriptedEngine()
    async with serve(engine, max_stream_interval=16) as served, served.client() as client:
        await served.set_quota(max_concurrent_requests=1)
        for path, body in [
            ("/v1/chat/completions", chat(served, stream_interval=17, stream=True)),
            ("/v1/chat/completions", chat(served, stream_interval=1_000_000)),
            ("/v1/completions", {"model": served.model, "prompt": "x", "stream_interval": 17}),
        ]:
            response = await client.post(path, json=body)
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == "stream_interval" and "16" in error["message"]
        assert engine.requests == {}
        assert await served.usage_records() == []
        body = chat(served, stream_interval=16, stream=True, max_tokens=2)
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
        assert (await quota_usage(served)).concurrent == 0
    [request] = engine.requests.values()
    assert request.params.stream_interval == 16
