"""What the real vLLM engine refuses about a request reaches the client as a 400, and the engine
serves on: prompts too long or empty, token ids out of the vocabulary, a seed too large to send
to the engine core."""

from __future__ import annotations

import pytest
from vllm import SamplingParams

from app.errors import BadRequestError
from tests.support.live_gateway import MAX_MODEL_LEN, LiveGateway

pytestmark = pytest.mark.slow

REFUSED = [
    ("too-long", list(range(1, MAX_MODEL_LEN + 1)), {}, "longer than the maximum model length"),
    ("empty", [], {}, "cannot be empty"),
    ("negative-id", [-5], {}, "out of vocabulary"),
    ("huge-id", [2**70], {}, "out of vocabulary"),
    ("seed", [1, 2, 3], {"seed": 2**64}, "out of range"),
]


def test_engine_refusals_are_400s_and_the_engine_serves_on(gateway: LiveGateway) -> None:
    gateway.run(refused_then_served(gateway))


async def refused_then_served(gateway: LiveGateway) -> None:
    engine = gateway.engine
    for name, prompt, options, says in REFUSED:
        params = SamplingParams(max_tokens=2, **options)
        with pytest.raises(BadRequestError) as refused:
            async for _ in engine.generate(prompt, params, f"refused-{name}", None):
                pass
        assert refused.value.status_code == 400
        assert says in refused.value.message, name
        assert engine.num_unfinished_requests() == 0, f"{name} left a request in the engine"
    outputs = [
        o async for o in engine.generate([1, 2, 3], SamplingParams(max_tokens=2), "ok", None)
    ]
    assert outputs[-1].finished
    await engine.check_health()
