"""What the attackers send: prompts, chat bodies and output constraints, built deterministically
(a seed, a variant number) so that every run sends the same bytes.

The constraint payloads are the costliest shapes within the gateway's bounds
(``max_structured_output_bytes``, 32 KiB; ``max_json_schema_depth``, 32; regex groups nested at
most 32 deep; ``max_schema_array_items``, 4,096; ``max_constraint_count``, 32,768): long counted
repetitions, deep rule chains, wide alternations, ambiguity. What
they cost depends on vLLM's backend. With ``structured_outputs_compact`` (the default) it is
llguidance, which compiles in the engine core between steps and computes each step's token
mask, which every request in the batch waits for; GBNF grammars were converted in Python,
in time quadratic in a chain of rules (the gateway now converts them:
app/serving/preparation/gbnf.py).
With it off it is xgrammar, which compiles up front, in the engine core. Each variant differs
in a number, so that no grammar cache answers for a previous one.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable
from typing import Any

MAX_CONSTRAINT_BYTES = 32_768
MAX_SCHEMA_DEPTH = 32
MAX_REGEX_GROUP_DEPTH = 32
MAX_SCHEMA_ARRAY_ITEMS = 4096
MAX_CONSTRAINT_COUNT = 32_768

_LETTERS = string.ascii_lowercase


def words(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choices(_LETTERS, k=rng.randint(2, 9))) for _ in range(count)]


def prose(chars: int, seed: int = 0) -> str:
    """``chars`` characters of words drawn from a few thousand made-up ones: text a BPE
    tokenizer has to work through (a repeated character would be one long cheap token run)."""
    rng = random.Random(seed)
    vocabulary = words(4000, seed)
    parts: list[str] = []
    length = 0
    while length < chars:
        chunk = " ".join(rng.choices(vocabulary, k=1000)) + " "
        parts.append(chunk)
        length += len(chunk)
    return "".join(parts)[:chars]


def chat_payload(model: str, content: str, *, max_tokens: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        **extra,
    }


def encoded(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def many_messages_body(model: str, messages: int, total_bytes: int) -> bytes:
    """A chat body of ``messages`` user messages, their contents padded with prose so that
    the body is ``total_bytes`` long (within a byte per message)."""
    empty = encoded(
        {
            "model": model,
            "messages": [{"role": "user", "content": ""}] * messages,
            "max_tokens": 1,
        }
    )
    padding = max(0, total_bytes - len(empty))
    each, extra = divmod(padding, messages)
    text = prose(each + 1, seed=messages)
    contents = [text[: each + (1 if i < extra else 0)] for i in range(messages)]
    return encoded(
        {
            "model": model,
            "messages": [{"role": "user", "content": c} for c in contents],
            "max_tokens": 1,
        }
    )


# Output constraints -------------------------------------------------------------------------


def _alternation(variant: int, budget: int, quote: str = "") -> str:
    """``w1|w2|...`` of made-up words, as long as fits in ``budget`` characters."""
    chosen: list[str] = []
    length = 0
    for word in words(20_000, seed=variant):
        item = f"{quote}{word}{variant}{quote}"
        if length + len(item) + 1 > budget:
            break
        chosen.append(item)
        length += len(item) + 1
    return "|".join(chosen)


def _nested_stars(variant: int) -> str:
    depth = MAX_REGEX_GROUP_DEPTH - 2
    return "(" * depth + f"a{{1,{100 + variant}}}" + ")*" * depth + "b"


REGEXES: tuple[Callable[[int], str], ...] = (
    lambda v: f".{{1,{32_000 - v}}}",  # one long counted repetition of anything
    lambda v: f"(.{{1,{1000 - v}}}){{1,100}}",  # counted repetition of one
    lambda v: f"(a|b)*a(a|b){{{2000 - v}}}",  # a DFA exponential in the count
    _nested_stars,  # quantifiers nested as deep as allowed
    lambda v: "(" + _alternation(v, MAX_CONSTRAINT_BYTES - 64) + ")+",
)


def _deep_rules(variant: int) -> str:
    rules = ["root ::= r0"]
    size = len(rules[0])
    number = 0
    while True:
        rule = f'r{number} ::= "(" r{number + 1} ")" | "x{variant}"'
        if size + len(rule) + 64 > MAX_CONSTRAINT_BYTES:
            break
        rules.append(rule)
        size += len(rule) + 1
        number += 1
    rules.append(f'r{number} ::= "x"')
    return "\n".join(rules)


GRAMMARS: tuple[Callable[[int], str], ...] = (
    _deep_rules,  # a chain of rules as long as fits
    lambda v: f"root ::= [a-z]{{1,{30_000 - v}}}",  # one long counted repetition
    # Ambiguous: every string of a's parses in exponentially many ways.
    lambda v: f'root ::= s\ns ::= s s | "a" | "b" s "c" | "{v}"',
    lambda v: "root ::= (" + _alternation(v, MAX_CONSTRAINT_BYTES - 64, quote='"') + ")+",
)


def _deep_schema(variant: int) -> dict[str, Any]:
    """Objects within objects down to the depth bound, a bounded string at the bottom."""
    schema: dict[str, Any] = {"type": "string", "maxLength": 1000 + variant}
    while json_depth(wrapped := _object_of(schema)) <= MAX_SCHEMA_DEPTH:
        schema = wrapped
    return schema


def _object_of(schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"a": schema, "b": {"type": "integer"}},
        "required": ["a", "b"],
    }


DISTINCT_BOUNDS = 4
"""Properties of the distinct-bounds schema. xgrammar (the backend with
``structured_outputs_compact`` off) compiles each distinct ``maxLength`` on its own, in time
linear in it: about 2 s a property of length 1000 here, 8 s for this schema. The 32 KiB bound
alone admits some 500 such properties, minutes of the engine core's CPU a request, which would
outlast the run; llguidance (the default backend) builds them lazily."""


def _distinct_bounds_schema(variant: int) -> dict[str, Any]:
    """Required string properties, each bounded in length by a number of its own."""
    properties = {
        f"p{number}": {
            "type": "string",
            "minLength": 1,
            "maxLength": 1000 + DISTINCT_BOUNDS * variant + number,
        }
        for number in range(DISTINCT_BOUNDS)
    }
    return {"type": "object", "properties": properties, "required": list(properties)}


SCHEMAS: tuple[Callable[[int], dict[str, Any]], ...] = (
    _deep_schema,
    _distinct_bounds_schema,
    lambda v: {
        "type": "array",
        "items": {"type": "string", "maxLength": 10_000 - v},
        "minItems": 1,
        "maxItems": MAX_SCHEMA_ARRAY_ITEMS,
    },
    lambda v: {"type": "string", "minLength": 1000, "maxLength": 30_000 - v},
)


def json_depth(value: Any) -> int:
    """How deep objects and arrays nest (a scalar is 0), as the gateway counts it."""
    if isinstance(value, dict):
        return 1 + max((json_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((json_depth(v) for v in value), default=0)
    return 0


def constraint_bytes(constraint: str | dict[str, Any]) -> int:
    """The size the gateway bounds: the text, or the schema as compact JSON."""
    if isinstance(constraint, str):
        return len(constraint.encode())
    return len(json.dumps(constraint, separators=(",", ":")).encode())


def constraint(kind: str, number: int) -> str | dict[str, Any]:
    """The ``number``-th constraint of ``kind`` (regex, grammar, json): the shapes in turn,
    each time with the next variant."""
    shapes: tuple[Callable[[int], Any], ...] = {
        "regex": REGEXES,
        "grammar": GRAMMARS,
        "json": SCHEMAS,
    }[kind]
    value: str | dict[str, Any] = shapes[number % len(shapes)](number // len(shapes))
    return value


def constrained_bodies(kind: str, model: str, count: int, *, max_tokens: int) -> list[bytes]:
    """``count`` chat bodies, each with the next constraint of ``kind``."""
    return [
        encoded(
            chat_payload(
                model,
                "Answer.",
                max_tokens=max_tokens,
                structured_outputs={kind: constraint(kind, number)},
            )
        )
        for number in range(count)
    ]


RED_TEAM_ITEMS = 10_000_000
"""Issue #48's count: 177 bytes whose compile took 52 s and 8 GB before counts were bounded."""


def counted_bodies(model: str) -> list[bytes]:
    """A count far past its bound, each way a schema comes in: issue #48's request as it was
    sent (``structured_outputs``), through ``response_format`` and through a forced call."""
    items = {"type": "array", "items": {"type": "string"}, "maxItems": RED_TEAM_ITEMS}
    response_format = {"type": "json_schema", "json_schema": {"name": "a", "schema": items}}
    parameters = {"type": "object", "properties": {"a": items}, "required": ["a"]}
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    return [
        encoded(chat_payload(model, "Hi", **fields))
        for fields in (
            {"structured_outputs": {"json": items}},
            {"response_format": response_format},
            {"tools": [tool], "tool_choice": "required"},
        )
    ]
