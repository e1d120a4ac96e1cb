"""What the attackers send is what the rows say: sizes, counts, and constraints that stay
within the gateway's bounds while differing every time (no grammar cache answers for them)."""

from __future__ import annotations

import json
import re

import pytest

from app.protocol import ChatCompletionRequest
from app.serving.preparation.structured import OutputConstraints
from app.settings import Settings
from tools.abuse.payloads import (
    GRAMMARS,
    MAX_CONSTRAINT_BYTES,
    MAX_REGEX_GROUP_DEPTH,
    MAX_SCHEMA_DEPTH,
    REGEXES,
    SCHEMAS,
    constrained_bodies,
    constraint,
    constraint_bytes,
    json_depth,
    many_messages_body,
    prose,
)
from tools.abuse.rows import BODY_BYTES, BODY_MESSAGES, MESSAGES_BOUND


def test_prose_is_as_long_as_asked_made_of_many_words_and_the_same_every_time() -> None:
    text = prose(10_000, seed=3)
    assert len(text) == 10_000
    assert len(set(text.split())) > 500
    assert prose(10_000, seed=3) == text != prose(10_000, seed=4)


@pytest.mark.parametrize(
    ("messages", "size"), [(BODY_MESSAGES, BODY_BYTES), (MESSAGES_BOUND, BODY_BYTES)]
)
def test_a_many_messages_body_has_the_messages_and_the_size_asked(messages: int, size: int) -> None:
    body = many_messages_body("model", messages, size)
    assert abs(len(body) - size) <= messages
    assert len(body) <= 8 << 20  # read by the gateway, not refused unread as too large
    payload = json.loads(body)
    assert len(payload["messages"]) == messages
    assert payload["max_tokens"] == 1


def group_depth(regex: str) -> int:
    """Nesting of unescaped parentheses (the payloads use no character class holding one)."""
    deepest = depth = 0
    for match in re.finditer(r"\\.|[()]", regex):
        if match.group() == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif match.group() == ")":
            depth -= 1
    return deepest


@pytest.mark.parametrize("kind", ["regex", "grammar", "json"])
def test_every_constraint_is_within_the_gateways_bounds(kind: str) -> None:
    shapes = {"regex": REGEXES, "grammar": GRAMMARS, "json": SCHEMAS}[kind]
    for number in range(2 * len(shapes)):
        value = constraint(kind, number)
        assert constraint_bytes(value) <= MAX_CONSTRAINT_BYTES
        if isinstance(value, dict):
            assert json_depth(value) <= MAX_SCHEMA_DEPTH
        elif kind == "regex":
            assert group_depth(value) <= MAX_REGEX_GROUP_DEPTH
            re.compile(value)
        # Within every bound the gateway applies by default, counts included.
        field = {"regex": "regex", "grammar": "grammar", "json": "json"}[kind]
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        request = ChatCompletionRequest.model_validate(
            body | {"structured_outputs": {field: value}}
        )
        assert OutputConstraints.from_settings(Settings()).constraint(request) is not None


def test_the_deep_schema_goes_as_deep_as_allowed() -> None:
    assert json_depth(constraint("json", 0)) in (MAX_SCHEMA_DEPTH - 1, MAX_SCHEMA_DEPTH)


@pytest.mark.parametrize("kind", ["regex", "grammar", "json"])
def test_no_two_constraints_of_a_run_are_the_same(kind: str) -> None:
    bodies = constrained_bodies(kind, "model", 64, max_tokens=16)
    assert len(set(bodies)) == 64
    first = json.loads(bodies[0])
    assert first["max_tokens"] == 16
    assert set(first["structured_outputs"]) == {kind}
