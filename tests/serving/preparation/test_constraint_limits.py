"""A pathological output constraint through the real app, in both roles: a ``pattern`` that
nests 1,000 groups (which makes Python's ``re``, checking the schema, recurse past its
limit), a repeat count ``re`` cannot hold, a regex nested as deep: each is a 400 naming the
field, through ``response_format``, ``structured_outputs`` and a forced tool call, and
nothing reaches the engine or the upstream (issue #23, item 5). So is a constraint llguidance
cannot compile against the model's tokenizer, with llguidance's reason.

Every count a constraint holds is bounded before anything compiles it (issue #48, item 1): a
177-byte schema asking for a million array items is refused at once, naming the field, the
keyword and the limit, where llguidance would spend seconds spelling the items out."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.settings import Settings
from tests.support.fake_upstream import FakeUpstream, fake_upstream
from tests.support.front_app import front_settings, running_front
from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import ServeFactory

DEEP_GROUPS = "(" * 1000 + "a" + ")" * 1000
HUGE_REPEAT = "a{99999999999999999999}"
TENANT = "tenant-a"
PLAIN_TOOL = {"type": "function", "function": {"name": "plain", "parameters": {"type": "object"}}}


def tool(parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "odd", "parameters": parameters}}


def pathological_bodies() -> Iterator[tuple[str, dict[str, Any], str]]:
    """(case, the chat fields, the field the 400 must name)."""
    for name, pattern in (("deep groups", DEEP_GROUPS), ("huge repeat", HUGE_REPEAT)):
        schemas = {
            "pattern": {"type": "string", "pattern": pattern},
            "patternProperties": {"type": "object", "patternProperties": {pattern: {}}},
        }
        for keyword, schema in schemas.items():
            case = f"{name} in {keyword}"
            response_format = {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": schema},
            }
            yield case, {"response_format": response_format}, "response_format.json_schema.schema"
            yield case, {"structured_outputs": {"json": schema}}, "structured_outputs.json"
            parameters = "tools[1].function.parameters"
            for choice in ("required", {"type": "function", "function": {"name": "odd"}}):
                fields = {"tools": [PLAIN_TOOL, tool(schema)], "tool_choice": choice}
                yield case, fields, parameters
    yield "deep regex", {"structured_outputs": {"regex": DEEP_GROUPS}}, "structured_outputs.regex"
    for grammar in ("root ::= missing", 'root ::= ("a"', "start: undefined"):
        yield grammar, {"structured_outputs": {"grammar": grammar}}, "structured_outputs.grammar"


ARRAY_ITEMS = Settings.model_fields["max_schema_array_items"].default
COUNT = Settings.model_fields["max_constraint_count"].default
A_MILLION = 1_000_000


def counted_bodies() -> Iterator[tuple[str, dict[str, Any], str, str, int]]:
    """(case, the chat fields, the field the 400 must name, the keyword it must name, the
    limit it must give): each count past its bound, each way a schema comes in."""
    strings = {"type": "array", "items": {"type": "string"}}
    items = strings | {"maxItems": A_MILLION}  # the red team's request, a tenth as large
    for keyword, schema, limit in (
        ("maxItems", items, ARRAY_ITEMS),
        ("minItems", strings | {"minItems": A_MILLION}, ARRAY_ITEMS),
        ("maxLength", {"type": "string", "maxLength": A_MILLION}, COUNT),
        ("minLength", {"type": "string", "minLength": A_MILLION}, COUNT),
        ("maxProperties", {"type": "object", "maxProperties": A_MILLION}, COUNT),
        ("minProperties", {"type": "object", "minProperties": A_MILLION}, COUNT),
        ("pattern", {"type": "string", "pattern": f"^a{{0,{A_MILLION}}}$"}, COUNT),
    ):
        yield (
            keyword,
            {"structured_outputs": {"json": schema}},
            "structured_outputs.json",
            keyword,
            limit,
        )
        response_format = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
        param = "response_format.json_schema.schema"
        yield keyword, {"response_format": response_format}, param, keyword, limit
        parameters = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
        fields = {"tools": [tool(parameters)], "tool_choice": "required"}
        yield keyword, fields, "tools[0].function.parameters", keyword, limit
    # Within the bound one by one, past it added up: each array spells its items out.
    halves = {f"p{n}": strings | {"maxItems": ARRAY_ITEMS // 2 + 1} for n in range(2)}
    added = {"type": "object", "properties": halves}
    yield (
        "arrays added up",
        {"structured_outputs": {"json": added}},
        "structured_outputs.json",
        "maxItems",
        ARRAY_ITEMS,
    )
    regex = f"[a-z]{{1,{A_MILLION}}}"
    yield (
        "regex",
        {"structured_outputs": {"regex": regex}},
        "structured_outputs.regex",
        "{1,",
        COUNT,
    )
    grammar = f'root ::= "a"{{1,{A_MILLION}}}'
    yield (
        "grammar",
        {"structured_outputs": {"grammar": grammar}},
        "structured_outputs.grammar",
        "{1,",
        COUNT,
    )


async def refusal(client: httpx.AsyncClient, model: str, fields: dict[str, Any]) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    return await client.post("/v1/chat/completions", json=body | fields)


async def assert_refused(client: httpx.AsyncClient, model: str) -> None:
    for case, fields, param in pathological_bodies():
        response = await refusal(client, model, fields)
        assert response.status_code == 400, (case, param, response.text)
        error = response.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", param), (case, error)
    for case, fields, param, keyword, limit in counted_bodies():
        response = await refusal(client, model, fields)
        assert response.status_code == 400, (case, param, response.text)
        error = response.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", param), (case, error)
        assert keyword in error["message"] and f"{limit:,}" in error["message"], (case, error)


async def test_in_process_a_pathological_constraint_is_a_400(serve: ServeFactory) -> None:
    engine = ScriptedEngine()
    async with serve(engine) as served, served.client() as client:
        await assert_refused(client, served.model)
    assert engine.requests == {}


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with fake_upstream() as fake:
        yield fake


@pytest.fixture
async def front_client(
    upstream: FakeUpstream, tmp_path: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """A front with a tool-call parser (the front forwards a forced call only with one) and a
    tenant allowed the base model; its client and the model name."""
    # Room for the tools' 2 KB patterns, which the prompt describes.
    settings = front_settings(
        upstream.url, tmp_path, tool_call_parser="pythonic", max_model_len=4096
    )
    async with running_front(settings) as front:
        tenant = {"id": TENANT, "name": TENANT, "allow_base_model": True}
        await front.admin("POST", "/tenants", tenant)
        key = (await front.admin("POST", f"/tenants/{TENANT}/keys", {"name": "k"}))["key"]
        async with front.client(key) as client:
            yield client, front.gateway.registry.base_model_id


async def test_the_front_refuses_a_pathological_constraint_with_a_400(
    front_client: tuple[httpx.AsyncClient, str], upstream: FakeUpstream
) -> None:
    client, model = front_client
    await assert_refused(client, model)
    # The front has the model's own tokenizer, over which llguidance cannot build this regex.
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "structured_outputs": {"regex": "(.{1,1000}){1,100}"},
    }
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "structured_outputs.regex"
    assert "too many expressions" in error["message"]
    assert upstream.requests == []
