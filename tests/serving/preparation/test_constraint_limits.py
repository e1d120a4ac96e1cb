"""A pathological output constraint through the real app, in both roles: a ``pattern`` that
nests 1,000 groups (which makes Python's ``re``, checking the schema, recurse past its
limit), a repeat count ``re`` cannot hold, a regex nested as deep: each is a 400 naming the
field, through ``response_format``, ``structured_outputs`` and a forced tool call, and
nothing reaches the engine or the upstream (issue #23, item 5). So is a constraint llguidance
cannot compile against the model's tokenizer, with llguidance's reason."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

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


async def assert_refused(client: httpx.AsyncClient, model: str) -> None:
    for case, fields, param in pathological_bodies():
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        body |= fields
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 400, (case, param, response.text)
        error = response.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", param), (case, error)


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
