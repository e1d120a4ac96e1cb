"""Constrained output, logit_bias and user on the real engine, through the official client:
JSON outputs parse and validate for the base model and adapters batched together, a cut
output says "length", a biased token is forced or banned, a bad schema is a 400 naming it."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from contextlib import closing
from typing import Any

import jsonschema
import openai
import pytest

from tests.support.live_gateway import LiveGateway

pytestmark = pytest.mark.slow

BASE = "SmolLM2-135M-Instruct"
CITY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "country": {"type": "string", "maxLength": 24},
        "continent": {"enum": ["Africa", "America", "Asia", "Europe", "Oceania"]},
        "capital": {"type": "boolean"},
    },
    "required": ["city", "country", "continent", "capital"],
    "additionalProperties": False,
}
CITY_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True},
}
MESSAGES = [{"role": "user", "content": "Describe Paris as JSON: city, country, continent."}]


async def test_json_outputs_validate_for_the_base_model_and_adapters_in_one_batch(
    gateway: LiveGateway,
) -> None:
    client = gateway.async_client("demo-all")
    models = [BASE, "legal_advisor", "medical_scribe"]
    # Greedy and sampled, schema and plain JSON mode, every model: all in flight at once.
    requests = [
        {"model": model, "response_format": response_format, **sampling}
        for model in models
        for response_format in (CITY_FORMAT, {"type": "json_object"})
        for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": 7})
    ]
    responses = await asyncio.gather(
        *(
            client.chat.completions.create(messages=MESSAGES, max_tokens=160, **request)
            for request in requests
        )
    )
    for request, response in zip(requests, responses, strict=True):
        choice = response.choices[0]
        content = choice.message.content or ""
        if request["response_format"] is CITY_FORMAT:
            # Every string in the schema is bounded: the object always closes in time.
            assert choice.finish_reason == "stop", (request, content)
            jsonschema.validate(json.loads(content), CITY_SCHEMA)
        elif choice.finish_reason == "stop":
            assert isinstance(json.loads(content), dict), (request, content)
        else:
            # An unbounded object (a fine-tune writing its note into a key) is cut, and
            # says so.
            assert choice.finish_reason == "length", (request, content)
            assert response.usage is not None and response.usage.completion_tokens == 160
    # Compact by default: no whitespace between the tokens of JSON.
    greedy_base = responses[0].choices[0].message.content or ""
    assert greedy_base == json.dumps(json.loads(greedy_base), separators=(",", ":"))


async def test_structured_outputs_on_text_completions(gateway: LiveGateway) -> None:
    client = gateway.async_client("demo-all")
    choice, regex, schema = await asyncio.gather(
        client.completions.create(
            model="telephony_support",
            prompt="Is the sky blue? Answer:",
            max_tokens=5,
            temperature=0,
            extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
        ),
        client.completions.create(
            model=BASE,
            prompt="A US phone number:",
            max_tokens=20,
            temperature=0,
            extra_body={"structured_outputs": {"regex": r"\d{3}-\d{3}-\d{4}"}},
        ),
        client.completions.create(
            model="legal_advisor",
            prompt="Paris as JSON:",
            max_tokens=160,
            temperature=0,
            extra_body={"structured_outputs": {"json": CITY_SCHEMA}},
        ),
    )
    assert choice.choices[0].text in ("yes", "no")
    assert len(regex.choices[0].text) == 12 and regex.choices[0].text[3] == "-"
    assert schema.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(schema.choices[0].text), CITY_SCHEMA)


def test_an_output_cut_by_max_tokens_finishes_with_length(gateway: LiveGateway) -> None:
    response = gateway.client("demo-all").chat.completions.create(
        model="medical_scribe",
        messages=MESSAGES,
        response_format=CITY_FORMAT,
        max_tokens=4,
        temperature=0,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "length"
    assert response.usage is not None and response.usage.completion_tokens == 4
    with pytest.raises(json.JSONDecodeError):
        json.loads(choice.message.content or "")


def test_logit_bias_forces_and_bans_tokens(gateway: LiveGateway) -> None:
    client = gateway.client("demo-all")
    tokenizer = gateway.engine.tokenizer
    asked: dict[str, Any] = {"model": BASE, "messages": MESSAGES, "temperature": 0}
    greedy = client.chat.completions.create(max_tokens=6, **asked)
    answer = greedy.choices[0].message.content or ""
    first_id = tokenizer.encode(answer, add_special_tokens=False)[0]
    banned = client.chat.completions.create(max_tokens=6, logit_bias={str(first_id): -100}, **asked)
    other = banned.choices[0].message.content or ""
    assert other != answer
    assert tokenizer.encode(other, add_special_tokens=False)[0] != first_id, (answer, other)

    forced_id = tokenizer.encode(" banana", add_special_tokens=False)[0]
    forced = client.chat.completions.create(max_tokens=5, logit_bias={str(forced_id): 100}, **asked)
    assert forced.choices[0].message.content == tokenizer.decode([forced_id] * 5)


def test_refusals_name_the_field(gateway: LiveGateway) -> None:
    client = gateway.client("demo-all")
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "bad", "schema": {"type": "strnig"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"logit_bias": {str(len(gateway.engine.tokenizer)): 5}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"tool_choice": "required"}, "tool_choice"),
    ]
    for fields, param in cases:
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model=BASE,
                messages=MESSAGES,
                max_tokens=4,
                **fields,
            )
        assert refused.value.status_code == 400
        assert refused.value.param == param, refused.value.message


def test_grammars_llguidance_must_refuse_or_converts_slowly_are_a_400_and_served(
    gateway: LiveGateway,
) -> None:
    """A regex llguidance cannot build over this tokenizer is a 400 with its reason, not an
    empty 200; a GBNF chain of 800 rules (which llguidance converts in quadratic time) is
    served under its grammar."""
    client = gateway.client("demo-all")
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=BASE,
            messages=MESSAGES,
            max_tokens=4,
            extra_body={"structured_outputs": {"regex": "(.{1,1000}){1,100}"}},
        )
    assert refused.value.param == "structured_outputs.regex"
    assert "too many expressions" in refused.value.message

    rules = [f'r{i} ::= "(" r{i + 1} ")" | "x{i}"' for i in range(800)]
    grammar = "\n".join(["root ::= r0", *rules, 'r800 ::= "x"'])
    response = client.chat.completions.create(
        model=BASE,
        messages=MESSAGES,
        max_tokens=16,
        temperature=0,
        extra_body={"structured_outputs": {"grammar": grammar}},
    )
    text = response.choices[0].message.content or ""
    depth = len(text) - len(text.lstrip("("))
    whole = "(" * depth + f"x{depth}" + ")" * depth
    if response.choices[0].finish_reason == "stop":
        assert text == whole
    else:
        assert whole.startswith(text), text


def test_the_user_is_recorded_in_the_usage_ledger(gateway: LiveGateway) -> None:
    response = gateway.client("demo-all").chat.completions.create(
        model="legal_advisor", messages=MESSAGES, max_tokens=2, user="end-user-42"
    )
    request_id = response.id.removeprefix("chatcmpl-")
    database = gateway.settings.database_url.removeprefix("sqlite+aiosqlite:///")
    deadline = time.monotonic() + 15  # the ledger writes once a second
    rows: list[tuple[str | None]] = []
    while not rows and time.monotonic() < deadline:
        time.sleep(0.2)
        with closing(sqlite3.connect(database)) as connection:
            query = "SELECT user FROM usage WHERE request_id = ?"
            rows = connection.execute(query, (request_id,)).fetchall()
    assert rows == [("end-user-42",)]


def test_a_streamed_json_answer_reassembles_to_valid_json(gateway: LiveGateway) -> None:
    stream = gateway.client("st-marys").chat.completions.create(
        model="medical_scribe",
        messages=MESSAGES,
        response_format=CITY_FORMAT,  # type: ignore[arg-type]
        max_tokens=160,
        temperature=0,
        stream=True,
    )
    chunks = [chunk for chunk in stream if chunk.choices]
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop", text
    jsonschema.validate(json.loads(text), CITY_SCHEMA)
