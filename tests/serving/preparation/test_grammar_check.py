"""The compile check runs in a process of its own, within a CPU budget (issue #48, item 1): a
compile past the budget is stopped, its process replaced, and the next check runs as usual;
what it had allocated goes with it. Through the app, such a constraint is a 400 naming the
field and the budget, and nothing reaches the engine."""

from __future__ import annotations

import os
from typing import Any

from vllm.sampling_params import StructuredOutputsParams
from vllm.v1.structured_output.backend_guidance import serialize_guidance_grammar
from vllm.v1.structured_output.request import get_structured_output_key

from app.serving.preparation.grammar_check import GrammarCheck
from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import ServeFactory
from tools.gateway_cost.engine import CharTokenizer

# The budget the tests set, and the grammars weighed against it. The verdicts are CPU time,
# which a loaded machine inflates a little (cache misses, switches), never by several times:
# TRIVIAL and CHEAP compile in about 1 ms in a fresh process (2 ms on two busy cores), COSTLY
# in 50 to 70 ms and FAR_TOO_COSTLY in about 250 ms, each several times away from the budget
# on either side (at 5 ms and 4,096 items, COSTLY's 17 ms was not).
BUDGET_MS = 8
COSTLY_ITEMS = 16_384
COSTLY = {"type": "array", "items": {"type": "string"}, "maxItems": COSTLY_ITEMS}
FAR_TOO_COSTLY = COSTLY | {"maxItems": 50_000}
CHEAP = {"type": "array", "items": {"type": "integer"}, "maxItems": 3}
TRIVIAL = "start: /a+/"


def grammar(schema: dict[str, Any]) -> str:
    params = StructuredOutputsParams(json=schema)
    return serialize_guidance_grammar(
        *get_structured_output_key(params), disable_any_whitespace=True
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_grammar_is_compiled_in_a_process_of_its_own() -> None:
    with GrammarCheck(CharTokenizer(), cpu_seconds=5.0) as check:
        assert check.refusal(grammar(CHEAP)) is None
        reason = check.refusal("start: undefined")
        assert reason is not None and "undefined" in reason
        assert check.pid is not None and check.pid != os.getpid()
        pid = check.pid
    assert not alive(pid)  # closed with the check


def test_a_compile_past_its_budget_is_refused_and_one_far_past_it_stopped() -> None:
    with GrammarCheck(CharTokenizer(), cpu_seconds=BUDGET_MS / 1000) as check:
        assert check.refusal(TRIVIAL) is None
        first = check.pid
        assert first is not None
        # Past the budget, whether it ended (its own clock says so) or was stopped.
        over = check.refusal(grammar(COSTLY))
        assert over is not None and f"more than {BUDGET_MS} ms of CPU" in over
        last = check.pid
        assert last is not None
        far_over = check.refusal(grammar(FAR_TOO_COSTLY))  # stopped on the way
        assert far_over is not None and f"more than {BUDGET_MS} ms of CPU" in far_over
        assert not alive(first) and not alive(last)
        assert check.refusal(TRIVIAL) is None  # in the process that replaced it
        assert check.pid not in (None, first, last)
    with GrammarCheck(CharTokenizer(), cpu_seconds=5.0) as with_room:
        assert with_room.refusal(grammar(COSTLY)) is None


async def test_a_constraint_past_the_budget_is_a_400_and_the_next_one_is_served(
    serve: ServeFactory,
) -> None:
    engine = ScriptedEngine()
    async with (
        # COSTLY within the counts' bounds, so that its compile is what refuses it.
        serve(
            engine, constraint_check_cpu_ms=BUDGET_MS, max_schema_array_items=COSTLY_ITEMS
        ) as served,
        served.client() as client,
    ):
        body = {
            "model": served.model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1,
            "structured_outputs": {"json": COSTLY},
        }
        refused = await client.post("/v1/chat/completions", json=body)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["param"] == "structured_outputs.json"
        assert f"more than {BUDGET_MS} ms of CPU" in error["message"]
        assert engine.requests == {}
        body["structured_outputs"] = {"regex": "[ab]"}
        served_next = await client.post("/v1/chat/completions", json=body)
        assert served_next.status_code == 200, served_next.text
