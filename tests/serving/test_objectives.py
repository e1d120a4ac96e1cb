"""Latency objectives through the real app over a scripted engine: each request carries its
class's objectives, or its tenant's own, in its SamplingParams to the engine, where the slot
turns read them; its class alone where none is set; and each request is counted by its
outcome."""

from __future__ import annotations

from vllm import SamplingParams

from app.inside_vllm.objectives import CLASS_KEY, TPOT_KEY, TTFT_KEY, Objectives
from app.serving.lifecycle.objectives import MIN_TTFT_MS, carry, spend_wait
from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import TENANT, Served, ServeFactory, chat

OBJECTIVES = {
    "slo_ttft_ms_interactive": 500,
    "slo_tpot_ms_interactive": 50,
    "slo_ttft_ms_batch": 60_000,
}
OUTCOMES = "lora_gateway_slo_outcomes_total"


async def post(served: Served, **fields: object) -> None:
    async with served.client() as client:
        response = await client.post("/v1/chat/completions", json=chat(served, **fields))
    assert response.status_code == 200, response.text


async def test_requests_carry_their_class_objectives_or_their_tenants_own(
    serve: ServeFactory,
) -> None:
    engine = ScriptedEngine()
    async with serve(engine, **OBJECTIVES) as served:
        await post(served, max_tokens=2)
        await served.admin("PATCH", f"/tenants/{TENANT}", {"priority": "batch"})
        await post(served, max_tokens=2)
        await served.admin("PATCH", f"/tenants/{TENANT}", {"slo_tpot_ms": 400})
        await post(served, max_tokens=2)
    interactive, batch, own = (r.params.extra_args for r in engine.started())
    # Each TTFT objective less the time the request spent in the gateway before the engine.
    ttfts = [args.pop(TTFT_KEY) for args in (interactive, batch, own)]
    assert 0 < ttfts[0] < 500 and 0 < ttfts[1] < 60_000 and 0 < ttfts[2] < 60_000
    assert interactive == {CLASS_KEY: "interactive", TPOT_KEY: 50}
    assert batch == {CLASS_KEY: "batch"}  # the batch class has no TPOT objective
    assert own == {CLASS_KEY: "batch", TPOT_KEY: 400}
    # As the engine core's scheduler reads them, in seconds.
    assert Objectives.of(own) == Objectives(interactive=False, tpot=0.4)


async def test_without_objectives_requests_carry_their_class_alone_or_their_tenants_own(
    serve: ServeFactory,
) -> None:
    """The class alone: the engine's turns are the quantum's, as before objectives, but a
    batch request's never pause an interactive stream, which the engine knows by its class."""
    engine = ScriptedEngine()
    async with serve(engine) as served:
        await post(served, max_tokens=2)
        await served.admin("PATCH", f"/tenants/{TENANT}", {"priority": "batch"})
        await post(served, max_tokens=2)
        await served.admin("PATCH", f"/tenants/{TENANT}", {"slo_ttft_ms": 800})
        await post(served, max_tokens=2)
    interactive, batch, own = (r.params.extra_args for r in engine.started())
    assert interactive == {CLASS_KEY: "interactive"}
    assert batch == {CLASS_KEY: "batch"}
    assert Objectives.of(batch) == Objectives(interactive=False)  # no objective: `any` false
    assert own is not None and set(own) == {CLASS_KEY, TTFT_KEY} and 0 < own[TTFT_KEY] < 800


def test_the_time_spent_in_the_gateway_comes_off_the_ttft_objective_never_all_of_it() -> None:
    params = SamplingParams()
    carry(params, Objectives(interactive=True, ttft=2.0, tpot=0.1))
    spend_wait(params, 0.5)
    assert params.extra_args == {CLASS_KEY: "interactive", TTFT_KEY: 1500, TPOT_KEY: 100}
    spend_wait(params, 3.0)
    assert params.extra_args[TTFT_KEY] == MIN_TTFT_MS
    assert Objectives.of(params.extra_args) == Objectives(True, MIN_TTFT_MS / 1000, 0.1)
    unset = SamplingParams()
    spend_wait(unset, 1.0)
    assert unset.extra_args is None


async def test_each_request_is_counted_by_its_outcome_against_its_objectives(
    serve: ServeFactory,
) -> None:
    """Each token a step of 20 ms: a first token no sooner, and 20 ms a token after it."""
    async with serve(ScriptedEngine(step_seconds=0.02), **OBJECTIVES) as served:

        def counted(outcome: str) -> float:
            return served.samples(OUTCOMES, **{"class": "interactive", "outcome": outcome})

        before = {o: counted(o) for o in ("met", "missed_ttft", "missed_tpot")}
        for ttft_ms, tpot_ms in [(60_000, 60_000), (60_000, 1), (1, 60_000)]:
            await served.admin(
                "PATCH", f"/tenants/{TENANT}", {"slo_ttft_ms": ttft_ms, "slo_tpot_ms": tpot_ms}
            )
            await post(served, max_tokens=3)
        await served.settled()
        assert {o: counted(o) - before[o] for o in before} == {
            "met": 1,
            "missed_tpot": 1,
            "missed_ttft": 1,
        }
