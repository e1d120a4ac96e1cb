"""The costliest output constraints the default bounds accept compile within 100 ms of CPU
(issue #48, item 1), as the engine's llguidance backend compiles them against the embedded
model's tokenizer: the whole array budget in one array, spread over many, behind ``anyOf``,
after ``prefixItems``, nested, and every other count at its bound. CPU time, the best of three,
so that a loaded machine's waits do not count."""

from __future__ import annotations

import time
from typing import Any

import pytest
from llguidance import LLMatcher, LLTokenizer
from llguidance.hf import from_tokenizer
from transformers import AutoTokenizer
from vllm.v1.structured_output.backend_guidance import serialize_guidance_grammar
from vllm.v1.structured_output.request import get_structured_output_key

from app.protocol import ChatCompletionRequest
from app.serving.preparation.structured import OutputConstraints
from app.settings import EMBEDDED_MODEL_DIR, Settings

CPU_SECONDS = 0.100
SETTINGS = Settings()
ITEMS = SETTINGS.max_schema_array_items
COUNT = SETTINGS.max_constraint_count
STRINGS = {"type": "array", "items": {"type": "string"}}


def costliest() -> dict[str, dict[str, Any]]:
    """Schemas that put the whole array budget, or every other count, at its bound."""
    spread = 16
    return {
        "one array": STRINGS | {"maxItems": ITEMS},
        "as many items required": STRINGS | {"minItems": ITEMS, "maxItems": ITEMS},
        "arrays behind anyOf": {
            "anyOf": [
                {
                    "type": "array",
                    "items": {"type": "integer", "minimum": n},
                    "maxItems": ITEMS // spread,
                }
                for n in range(spread)
            ]
        },
        "after prefixItems": {
            "type": "array",
            "prefixItems": [{"type": "integer"}] * 3,
            "items": {"type": "string"},
            "maxItems": ITEMS,
        },
        "arrays of objects": {
            "type": "object",
            "properties": {
                f"p{n}": {
                    "type": "array",
                    "items": {"type": "object", "properties": {"a": {"type": "integer"}}},
                    "maxItems": ITEMS // spread,
                }
                for n in range(spread)
            },
        },
        "nested arrays": {
            "type": "array",
            "maxItems": ITEMS // 2,
            "items": STRINGS | {"maxItems": ITEMS // 2},
        },
        "every other count": {
            "type": "object",
            "minProperties": 2,
            "maxProperties": COUNT,
            "properties": {
                "text": {"type": "string", "minLength": COUNT // 2, "maxLength": COUNT},
                "code": {"type": "string", "pattern": f"^(a{{0,{COUNT}}}b){{0,{COUNT}}}$"},
            },
            "required": ["text", "code"],
        },
    }


@pytest.fixture(scope="module")
def tokenizer() -> LLTokenizer:
    hf = AutoTokenizer.from_pretrained(EMBEDDED_MODEL_DIR)
    return from_tokenizer(hf, len(hf))


def compile_seconds(tokenizer: LLTokenizer, grammar: str) -> float:
    """The CPU time of llguidance's compile and first token mask, the best of three."""
    best = float("inf")
    for _ in range(3):
        began = time.thread_time()
        matcher = LLMatcher(tokenizer, grammar, log_level=0)
        assert not matcher.is_error(), matcher.get_error()
        matcher.compute_bitmask()
        assert not matcher.is_error(), matcher.get_error()
        best = min(best, time.thread_time() - began)
    return best


@pytest.mark.parametrize("shape", list(costliest()))
def test_the_costliest_accepted_schema_compiles_within_100_ms(
    tokenizer: LLTokenizer, shape: str
) -> None:
    schema = costliest()[shape]
    request = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "structured_outputs": {"json": schema},
        }
    )
    constraint = OutputConstraints.from_settings(SETTINGS).constraint(request)
    assert constraint is not None  # accepted: within every bound
    grammar = serialize_guidance_grammar(
        *get_structured_output_key(constraint.params), disable_any_whitespace=True
    )
    seconds = compile_seconds(tokenizer, grammar)
    assert seconds <= CPU_SECONDS, f"{shape}: {seconds * 1000:.0f} ms of CPU"
