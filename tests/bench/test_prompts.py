"""Prompts of a fixed length in the embedded model's tokens, as the server counts them."""

from __future__ import annotations

import pytest

from app.settings import EMBEDDED_MODEL_DIR
from bench.prompts import SizedPrompts


def test_every_prompt_is_the_length_asked_and_its_own() -> None:
    prompts = SizedPrompts(EMBEDDED_MODEL_DIR, 128)
    made = [prompts(f"d: zipf, 8 adapters on 4 slots #{i}") for i in range(12)]
    assert [prompts.length(p) for p in made] == [128] * 12
    assert len(set(made)) == 12 and made[3].startswith("d: zipf, 8 adapters on 4 slots #3. ")
    with pytest.raises(ValueError, match="40 tokens cannot hold the chat template"):
        SizedPrompts(EMBEDDED_MODEL_DIR, 40)("x")
