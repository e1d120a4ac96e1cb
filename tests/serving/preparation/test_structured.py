"""response_format, structured_outputs and logit_bias: what the protocol accepts, what it
refuses naming the field, and the SamplingParams the engine is given."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from vllm.v1.serial_utils import MsgpackEncoder

from app.engine.vllm_engine import engine_args
from app.errors import BadRequestError
from app.protocol import UNSUPPORTED_FIELDS, ChatCompletionRequest, CompletionRequest
from app.serving.preparation.gbnf import gbnf_to_lark
from app.serving.preparation.generation import sampling_params
from app.serving.preparation.structured import OutputConstraints
from app.settings import Settings

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "hi", **fields}


def json_schema(schema: Any = SCHEMA, **spec: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "city", "schema": schema, **spec}}


def refused(model: type[ChatCompletionRequest | CompletionRequest], body: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    return ".".join(str(part) for part in caught.value.errors()[0]["loc"])


def params_of(
    body: dict[str, Any], constraints: OutputConstraints | None = None, **kwargs: Any
) -> Any:
    model = ChatCompletionRequest if "messages" in body else CompletionRequest
    request = model.model_validate(body)
    constraint = (constraints or OutputConstraints()).constraint(request)
    structured = None if constraint is None else constraint.params
    return sampling_params(
        request, prompt_tokens=5, max_model_len=1000, structured_outputs=structured, **kwargs
    )


def test_only_the_supported_fields_left_the_refusal_list() -> None:
    assert "response_format" not in UNSUPPORTED_FIELDS
    assert "logit_bias" not in UNSUPPORTED_FIELDS
    assert {"functions", "function_call"} <= set(UNSUPPORTED_FIELDS)


def test_text_is_free_output() -> None:
    assert params_of(chat(response_format={"type": "text"})).structured_outputs is None
    assert params_of(chat()).structured_outputs is None


def test_json_object_constrains_to_any_object() -> None:
    constraint = params_of(chat(response_format={"type": "json_object"})).structured_outputs
    assert constraint.json_object is True and constraint.json is None


@pytest.mark.parametrize("strict", [True, False, None])
def test_json_schema_constrains_to_the_schema(strict: bool | None) -> None:
    body = chat(response_format=json_schema(strict=strict, description="a city"))
    params = params_of(body)
    assert params.structured_outputs.json == SCHEMA
    MsgpackEncoder().encode(params)  # the engine core's transport takes it


@pytest.mark.parametrize(
    ("constraint", "field", "expected"),
    [
        ({"json": SCHEMA}, "json", SCHEMA),
        ({"regex": "[0-9]{3}"}, "regex", "[0-9]{3}"),
        # GBNF reaches the engine as Lark (app/serving/preparation/gbnf.py); Lark as it came.
        ({"grammar": 'root ::= "yes" | "no"'}, "grammar", gbnf_to_lark('root ::= "yes" | "no"')),
        ({"grammar": 'start: "yes" | "no"'}, "grammar", 'start: "yes" | "no"'),
        ({"choice": ["red", "blue"]}, "choice", ["red", "blue"]),
        ({"json_object": True}, "json_object", True),
    ],
)
def test_vllm_structured_outputs_on_completions(
    constraint: dict[str, Any], field: str, expected: Any
) -> None:
    params = params_of(completion(structured_outputs=constraint))
    assert getattr(params.structured_outputs, field) == expected


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat(response_format={"type": "json_schema"}), "response_format.json_schema"),
        (chat(response_format={"type": "xml"}), "response_format.type"),
        (chat(response_format=json_schema(schema=[1])), "response_format.json_schema.schema"),
        (chat(response_format=json_schema(strict="yes")), "response_format.json_schema.strict"),
        (
            chat(response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}}),
            "response_format.json_schema.name",
        ),
        (
            chat(response_format={"type": "json_schema", "json_schema": {"name": "a b"}}),
            "response_format.json_schema.name",
        ),
        (completion(structured_outputs={}), "structured_outputs"),
        (completion(structured_outputs={"regex": "a", "choice": ["a"]}), "structured_outputs"),
        (completion(structured_outputs={"choice": []}), "structured_outputs.choice"),
        (completion(structured_outputs={"json_object": False}), "structured_outputs.json_object"),
        (
            completion(structured_outputs={"regex": "a", "structural_tag": "{}"}),
            "structured_outputs.structural_tag",
        ),
        (
            completion(structured_outputs={"regex": "a"}, response_format={"type": "json_object"}),
            "structured_outputs",
        ),
        (chat(logit_bias=[1, 2]), "logit_bias"),
        (chat(logit_bias={"a": 1}), "logit_bias"),
        (chat(logit_bias={"-1": 1}), "logit_bias"),
        (chat(logit_bias={"1": 100.5}), "logit_bias"),
        (chat(logit_bias={"1": -101}), "logit_bias"),
        (chat(logit_bias={"1": True}), "logit_bias"),
        (chat(logit_bias={"1": "5"}), "logit_bias"),
        (chat(logit_bias={str(token): 1 for token in range(301)}), "logit_bias"),
    ],
)
def test_bad_constraints_are_refused_naming_the_field(body: dict[str, Any], param: str) -> None:
    model = ChatCompletionRequest if "messages" in body else CompletionRequest
    assert refused(model, body) == param


def test_logit_bias_reaches_the_engine_at_its_bounds() -> None:
    bias = {str(token): (-100 if token % 2 else 100) for token in range(300)}
    params = params_of(chat(logit_bias=bias), vocabulary=1000)
    assert len(params.logit_bias) == 300
    assert params.logit_bias[0] == 100.0 and params.logit_bias[1] == -100.0
    assert params_of(chat(logit_bias={})).logit_bias is None


def test_logit_bias_ids_must_be_in_the_vocabulary() -> None:
    params_of(chat(logit_bias={"999": 5}), vocabulary=1000)
    with pytest.raises(BadRequestError) as caught:
        params_of(chat(logit_bias={"5": 1, "1000": 5}), vocabulary=1000)
    assert caught.value.param == "logit_bias" and "1000" in caught.value.message


def test_the_user_is_not_sent_to_the_engine() -> None:
    plain = params_of(chat(temperature=0))
    named = params_of(chat(temperature=0, user="end-user-7"))
    assert repr(plain) == repr(named)


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat(response_format=json_schema(nested(20))), "response_format.json_schema.schema"),
        (completion(structured_outputs={"json": nested(20)}), "structured_outputs.json"),
    ],
)
def test_too_deep_a_schema_is_refused(body: dict[str, Any], param: str) -> None:
    # nested(20) is 41 objects deep: over a limit of 32, under vLLM's own 64.
    with pytest.raises(BadRequestError) as caught:
        params_of(body)
    assert caught.value.param == param and "deep" in caught.value.message
    params_of(body, constraints=OutputConstraints(max_depth=64))


@pytest.mark.parametrize(
    ("constraint", "param"),
    [
        ({"json": {"enum": ["x" * 100]}}, "structured_outputs.json"),
        ({"regex": "x" * 100}, "structured_outputs.regex"),
        ({"grammar": 'root ::= "' + "x" * 100 + '"'}, "structured_outputs.grammar"),
        ({"choice": ["x" * 100]}, "structured_outputs.choice"),
    ],
)
def test_too_large_a_constraint_is_refused(constraint: dict[str, Any], param: str) -> None:
    body = completion(structured_outputs=constraint)
    with pytest.raises(BadRequestError) as caught:
        params_of(body, constraints=OutputConstraints(max_bytes=64))
    assert caught.value.param == param and "64 bytes" in caught.value.message
    params_of(body, constraints=OutputConstraints(max_bytes=200))


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "strnig"},
        {"type": "object", "properties": {"a": {"minLength": -1}}},
        {"type": "object", "required": "a"},
        {"type": "string", "pattern": "("},
        {"$schema": 5},
        {"$schema": ["x"]},
    ],
)
def test_a_schema_that_is_not_json_schema_is_refused(schema: dict[str, Any]) -> None:
    with pytest.raises(BadRequestError) as caught:
        params_of(chat(response_format=json_schema(schema)))
    assert caught.value.param == "response_format.json_schema.schema"
    assert "not a valid JSON Schema" in caught.value.message


@pytest.mark.parametrize("compact", [True, False])
def test_the_engine_takes_the_whitespace_setting(compact: bool) -> None:
    # vLLM refuses disable_any_whitespace with its "auto" backend when the engine is built.
    config = engine_args(Settings(_env_file=None, structured_outputs_compact=compact))  # type: ignore[call-arg]
    assert config.structured_outputs_config.disable_any_whitespace is compact
    assert config.structured_outputs_config.backend == ("guidance" if compact else "auto")


DEEP_GROUPS = "(" * 1000 + "a" + ")" * 1000


def forced_call(parameters: dict[str, Any], choice: Any = "required") -> dict[str, Any]:
    tools = [
        {"type": "function", "function": {"name": "plain"}},
        {"type": "function", "function": {"name": "odd", "parameters": parameters}},
    ]
    return chat(tools=tools, tool_choice=choice)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat(response_format=json_schema(SCHEMA)), "response_format.json_schema.schema"),
        (completion(structured_outputs={"json": SCHEMA}), "structured_outputs.json"),
        (forced_call(SCHEMA), "tools[1].function.parameters"),
        (
            forced_call(SCHEMA, {"type": "function", "function": {"name": "odd"}}),
            "tools[1].function.parameters",
        ),
    ],
)
@pytest.mark.parametrize(
    ("pattern", "max_regex_depth", "said"),
    [
        # Refused by its nesting before anything compiles it.
        (DEEP_GROUPS, 32, "groups 1000 levels deep"),
        # With no such bound, Python's re recurses past its limit checking the schema.
        (DEEP_GROUPS, 10_000, "too deeply"),
        # Past the count bound, before re reads it (it would raise OverflowError).
        ("a{99999999999999999999}", 32, "allows counts up to 32,768"),
    ],
)
@pytest.mark.parametrize("keyword", ["pattern", "patternProperties"])
def test_a_pathological_pattern_is_refused_naming_the_field(
    body: dict[str, Any], param: str, pattern: str, max_regex_depth: int, said: str, keyword: str
) -> None:
    """Whatever the field, a pattern the check cannot take is a 400 (issue #23, item 5)."""
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"a": {"type": "string", "pattern": pattern}},
    }
    if keyword == "patternProperties":
        schema = {"type": "object", "patternProperties": {pattern: {"type": "string"}}}
    odd = replaced(body, SCHEMA, schema)
    constraints = OutputConstraints(max_regex_depth=max_regex_depth)
    with pytest.raises(BadRequestError) as caught:
        params_of(odd, constraints=constraints)
    assert caught.value.param == param
    assert said in caught.value.message


def replaced(value: Any, old: Any, new: Any) -> Any:
    """``value`` with every ``old`` in it replaced by ``new``."""
    if value == old:
        return new
    if isinstance(value, dict):
        return {key: replaced(item, old, new) for key, item in value.items()}
    if isinstance(value, list):
        return [replaced(item, old, new) for item in value]
    return value


@pytest.mark.parametrize(
    ("regex", "depth"),
    [
        ("(" * 40 + "a" + ")" * 40, 40),
        ("(?:" * 3 + "a" + ")" * 3, 3),
        ("((a)(b))" * 100, 2),
        # Escaped, or in a character class (where "]" first is a member): no group.
        ("\\(" * 100 + "a", 0),
        ("[(]" * 100, 0),
        ("[]((]" + "[^]((]" + "(a)", 1),
        ("[\\]((]" + "(a)", 1),
    ],
)
def test_regex_groups_are_counted_as_re_reads_them(regex: str, depth: int) -> None:
    body = completion(structured_outputs={"regex": regex})
    within = OutputConstraints(max_regex_depth=depth)
    assert params_of(body, constraints=within).structured_outputs.regex == regex
    with pytest.raises(BadRequestError) as caught:
        params_of(body, constraints=OutputConstraints(max_regex_depth=depth - 1))
    assert caught.value.param == "structured_outputs.regex"
    assert f"groups {depth} levels deep" in caught.value.message


def test_a_regex_may_nest_32_groups() -> None:
    for depth, allowed in ((32, True), (33, False)):
        regex = "(" * depth + "a" + ")" * depth
        body = completion(structured_outputs={"regex": regex})
        if allowed:
            assert params_of(body).structured_outputs.regex == regex
        else:
            with pytest.raises(BadRequestError, match="at most 32"):
                params_of(body)


def test_only_the_forced_function_is_checked() -> None:
    """A named call decodes under its own function's parameters alone."""
    body = forced_call({"type": "strnig"}, {"type": "function", "function": {"name": "plain"}})
    assert params_of(body).structured_outputs.json == {"type": "object", "properties": {}}
    with pytest.raises(BadRequestError) as caught:
        params_of({**body, "tool_choice": "required"})
    assert caught.value.param == "tools[1].function.parameters"
