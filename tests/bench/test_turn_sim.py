"""``bench.turn_sim``: vLLM's scheduler and ours stepped on a simulated clock, each request
counted as `vllm bench serve` counts it, and what our scheduler measures of a turn's cost."""

from __future__ import annotations

from bench.turn_sim import Costs, Load, simulate

SMALL = Load(adapters=12, concurrency=8, requests=24, ttft=1.0, tpot=0.2)
STEADY = Costs(base=0.05, per_token=0.001, activation=0.1, noise=0.0)


def test_every_request_runs_whole_and_vllms_scheduler_takes_no_turn() -> None:
    vllm = simulate(SMALL, STEADY, seed=1, turns=False)
    assert len(vllm.met) == SMALL.requests
    assert vllm.output == SMALL.requests * SMALL.output_tokens
    assert vllm.turns.total() == 0 and vllm.turn_seconds == 0.0
    # A step decodes at most one stream of each of the 4 slots' adapters, or computes prompts.
    assert vllm.wall >= vllm.steps * STEADY.base
    assert simulate(SMALL, STEADY, seed=1, turns=False).ttft == vllm.ttft  # seeded


def test_the_scheduler_measures_what_a_turn_adds_to_its_step() -> None:
    """A turn's step computes its request's prompt and activates its adapter: our scheduler
    learns that time from the steps it times, and a turn is taken within it."""
    ours = simulate(SMALL, STEADY, seed=1, turns=True)
    assert len(ours.met) == SMALL.requests
    assert ours.turns.total() > 0
    prompt = SMALL.prompt_tokens * STEADY.per_token
    assert STEADY.activation / 2 < ours.turn_seconds < 2 * (STEADY.activation + prompt)


def test_an_open_loop_sends_at_its_rate_whatever_the_engine_does() -> None:
    load = Load(adapters=4, rate=2.0, requests=20, ttft=1.0, tpot=0.2)
    run = simulate(load, STEADY, seed=3, turns=False)
    assert len(run.met) == load.requests
    assert run.wall > (load.requests - 1) / load.rate / 3  # spread over time, not sent at once
