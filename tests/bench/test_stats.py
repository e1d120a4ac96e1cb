"""Benchmark figures and ratios: percentiles, per-sample figures, the bootstrap
interval over rounds and requests, the interleaved order, residency deltas."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.client import RequestRecord
from bench.stats import (
    ACTIVATION_MS,
    ACTIVATION_SECONDS,
    ACTIVATIONS,
    ACTIVATIONS_PER_100,
    LOAD_MS,
    LOAD_SECONDS,
    LOADS,
    LOADS_PER_100,
    OUTPUT_TPS,
    STEP_MS,
    TOKENS_PER_STEP,
    TPOT_P50,
    TTFT_P50,
    TTFT_P99,
    Estimate,
    Sample,
    interleaved,
    median_of_rounds,
    percentile,
    ratio_estimate,
    seen_steps,
)
from bench.swap_counters import parse_swap_counters


def record(
    index: int, *, ttft: float, itl: list[float], tokens: int, error: str | None = None
) -> RequestRecord:
    e2e = ttft + sum(itl)
    return RequestRecord(
        system="x", point="main", index=index, tenant=0, model="m", scheduled=float(index),
        started=float(index) + 0.01, ttft=ttft, itl=itl, e2e=e2e, output_tokens=tokens,
        prompt_tokens=20, status=200 if error is None else 500, error=error,
    )  # fmt: skip


def sample(
    ttfts: list[float],
    *,
    tokens: int = 10,
    wall: float = 10.0,
    round_: int = 0,
    system: str = "x",
    counters: dict[str, float] | None = None,
) -> Sample:
    records = tuple(
        record(i, ttft=t, itl=[0.01] * (tokens - 1), tokens=tokens) for i, t in enumerate(ttfts)
    )
    return Sample(system, "p", round_, records, wall, counters or {})


def test_percentile_interpolates_like_numpy() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 5.0
    assert percentile(values, 25) == 2.0
    assert percentile(values, 99) == pytest.approx(4.96)
    assert percentile([], 50) is None


def test_figures_count_completed_requests_only() -> None:
    records = (
        record(0, ttft=0.1, itl=[0.02, 0.04], tokens=3),
        record(1, ttft=0.3, itl=[0.06], tokens=2),
        record(2, ttft=9.0, itl=[9.0], tokens=2, error="HTTP 500"),
    )
    s = Sample("x", "p", 0, records, 2.0)
    assert s.errors == 1
    assert OUTPUT_TPS.of(s) == pytest.approx(2.5)  # (3 + 2) tokens in 2 s
    assert TTFT_P50.of(s) == pytest.approx(0.2)  # the failed request's 9 s is left out
    assert TPOT_P50.of(s) == pytest.approx((0.03 + 0.06) / 2)
    assert LOADS_PER_100.of(s) is None  # a system that counts no swaps
    assert LOAD_MS.of(s) is None


def test_loads_and_activations_per_hundred_completed_requests_and_their_time() -> None:
    counters = {LOADS: 2.0, ACTIVATIONS: 6.0, ACTIVATION_SECONDS: 0.03}
    s = sample([0.1] * 8, counters=counters)
    assert LOADS_PER_100.of(s) == pytest.approx(25.0)
    assert ACTIVATIONS_PER_100.of(s) == pytest.approx(75.0)
    assert ACTIVATION_MS.of(s) == pytest.approx(0.005)  # seconds; the report shows ms
    assert LOAD_MS.of(s) is None  # no load time reported
    assert LOAD_MS.of(sample([0.1] * 8, counters={LOADS: 0.0, LOAD_SECONDS: 0.0})) is None


def test_the_engine_steps_are_the_token_arrivals_close_together() -> None:
    """Two streams a token each 100 ms, 4 ms apart: one step each 100 ms, of 2 tokens; a third
    stream 50 ms off theirs takes steps of its own."""
    streams = [
        RequestRecord(
            system="x", point="p", index=i, tenant=0, model="m", scheduled=0.0,
            started=0.0, ttft=0.05 + offset, itl=[0.1] * 9, output_tokens=10,
        )
        for i, offset in enumerate([0.0, 0.004])
    ]  # fmt: skip
    # The window: 10% to 80% of the last token's 0.954 s, holding the arrivals at
    # 0.15 (and 0.154) ... 0.75 s.
    steps, tokens, seconds = seen_steps(streams)
    assert (steps, tokens) == (7, 14) and seconds == pytest.approx(0.7 * 0.954)
    s = Sample("x", "p", 0, tuple(streams), 1.0)
    assert TOKENS_PER_STEP.of(s) == 2.0
    assert STEP_MS.of(s) == pytest.approx(0.7 * 0.954 / 7)
    apart = replace(streams[0], index=2, ttft=0.1, itl=[0.1] * 8)  # 0.1 ... 0.9 s
    assert seen_steps([*streams, apart])[:2] == (14, 21)
    failed = Sample("x", "p", 0, (replace(streams[0], error="x"),), 1.0)
    assert seen_steps(failed.records) == (0, 0, 0.0) and TOKENS_PER_STEP.of(failed) is None


def test_median_over_rounds() -> None:
    rounds = [sample([t], round_=i) for i, t in enumerate([0.1, 0.5, 0.2])]
    assert median_of_rounds(TTFT_P50, rounds) == pytest.approx(0.2)


def test_ratio_is_the_median_of_round_ratios() -> None:
    pairs = [
        (sample([0.1] * 5, wall=w_x, round_=i), sample([0.1] * 5, wall=w_y, round_=i))
        for i, (w_x, w_y) in enumerate([(10.0, 10.0), (10.0, 8.0), (10.0, 12.5)])
    ]
    estimate = ratio_estimate(OUTPUT_TPS, pairs, seed=1, draws=500)
    assert estimate.rounds == pytest.approx((1.0, 0.8, 1.25))
    assert estimate.median == pytest.approx(1.0)
    # Every request generates the same tokens, so only resampling the rounds moves
    # the ratio: the interval spans the rounds' ratios, and no further.
    assert estimate.low is not None and estimate.high is not None
    assert 0.8 <= estimate.low < 1.0 < estimate.high <= 1.25


def test_interval_is_seeded_and_narrows_with_more_requests() -> None:
    import random

    rng = random.Random(3)

    def noisy(n: int, scale: float, round_: int) -> Sample:
        return sample([rng.expovariate(1 / scale) for _ in range(n)], round_=round_)

    few = [(noisy(10, 2.0, r), noisy(10, 1.0, r)) for r in range(3)]
    many = [(noisy(400, 2.0, r), noisy(400, 1.0, r)) for r in range(3)]
    a = ratio_estimate(TTFT_P50, few, seed=7, draws=400)
    assert a == ratio_estimate(TTFT_P50, few, seed=7, draws=400)
    assert a != ratio_estimate(TTFT_P50, few, seed=8, draws=400)
    b = ratio_estimate(TTFT_P50, many, seed=7, draws=400)
    assert a.low is not None and a.high is not None and b.low is not None and b.high is not None
    assert b.high - b.low < (a.high - a.low) / 2
    assert b.low < 2.0 < b.high  # the true ratio of the medians is 2
    assert b.excludes(1.0) and not b.excludes(2.0)


def test_one_round_still_has_a_request_interval() -> None:
    pair = [(sample([0.1, 0.2, 0.3, 0.4]), sample([0.1, 0.1, 0.1, 0.1]))]
    estimate = ratio_estimate(TTFT_P99, pair, seed=0, draws=300)
    assert estimate.median == pytest.approx(0.397 / 0.1)
    assert estimate.low is not None and estimate.low < estimate.median


def test_no_completed_request_gives_no_ratio() -> None:
    failed = Sample("x", "p", 0, (record(0, ttft=1, itl=[], tokens=0, error="x"),), 1.0)
    estimate = ratio_estimate(TTFT_P50, [(failed, sample([0.1]))], seed=0, draws=50)
    assert estimate == Estimate(None, None, None, (None,))
    assert estimate.text() == "-"


def test_interleaved_order_takes_turns_round_by_round() -> None:
    assert interleaved(["A", "B", "C"], 2) == [
        (0, "A"), (0, "B"), (0, "C"), (1, "A"), (1, "B"), (1, "C"),
    ]  # fmt: skip
    with pytest.raises(ValueError):
        interleaved(["A", "A"], 1)
    with pytest.raises(ValueError):
        interleaved(["A"], 0)


METRICS_BEFORE = """\
# TYPE lora_gateway_adapter_uses_total counter
lora_gateway_adapter_uses_total{adapter="a",tier="device",version="1"} 3.0
lora_gateway_adapter_uses_total{adapter="b",tier="device",version="1"} 1.0
lora_gateway_adapter_uses_total{adapter="a",tier="storage",version="1"} 1.0
# TYPE lora_gateway_adapter_swap_seconds histogram
lora_gateway_adapter_swap_seconds_bucket{le="0.01",stage="load"} 1.0
lora_gateway_adapter_swap_seconds_bucket{le="0.02",stage="load"} 1.0
lora_gateway_adapter_swap_seconds_bucket{le="+Inf",stage="load"} 1.0
lora_gateway_adapter_swap_seconds_count{stage="load"} 1.0
lora_gateway_adapter_swap_seconds_sum{stage="load"} 0.005
"""

METRICS_AFTER = """\
# TYPE lora_gateway_adapter_uses_total counter
lora_gateway_adapter_uses_total{adapter="a",tier="device",version="1"} 10.0
lora_gateway_adapter_uses_total{adapter="b",tier="device",version="1"} 4.0
lora_gateway_adapter_uses_total{adapter="a",tier="storage",version="1"} 2.0
lora_gateway_adapter_uses_total{adapter="b",tier="host",version="1"} 4.0
# TYPE lora_gateway_adapter_swap_seconds histogram
lora_gateway_adapter_swap_seconds_bucket{le="0.01",stage="load"} 1.0
lora_gateway_adapter_swap_seconds_bucket{le="0.02",stage="load"} 5.0
lora_gateway_adapter_swap_seconds_bucket{le="+Inf",stage="load"} 5.0
lora_gateway_adapter_swap_seconds_count{stage="load"} 5.0
lora_gateway_adapter_swap_seconds_sum{stage="load"} 0.065
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0"} 0.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 6.0
# TYPE lora_gateway_slot_turns counter
lora_gateway_slot_turns_total{rule="objective"} 3.0
lora_gateway_slot_turns_total{rule="quantum"} 1.0
lora_gateway_slot_turns_total{rule="first_token"} 2.0
# TYPE lora_gateway_headroom_seats counter
lora_gateway_headroom_seats_total{how="parked"} 2.0
lora_gateway_headroom_seats_total{how="preempted"} 1.0
"""


def test_residency_is_the_difference_of_two_scrapes() -> None:
    delta = parse_swap_counters(METRICS_AFTER) - parse_swap_counters(METRICS_BEFORE)
    report = delta.to_json()
    assert report["uses"] == {"device": 10.0, "host": 4.0, "storage": 1.0}
    assert report["device_hit_rate"] == pytest.approx(10 / 15)
    assert report["swaps"]["load"] == 4.0
    assert report["swap_mean_seconds"]["load"] == pytest.approx(0.015)
    assert report["swap_mean_seconds"]["activate"] is None
    assert report["swap_p50_seconds"]["load"] == pytest.approx(0.015)
    assert report["swap_p99_seconds"]["load"] == pytest.approx(0.0199)
    assert report["preemptions"] == 6.0
    assert (report["turns"], report["headroom_seats"]) == (6.0, 3.0)
    assert delta.first_token_turns == 2.0


def test_residency_of_rounds_adds_up() -> None:
    one = parse_swap_counters(METRICS_AFTER) - parse_swap_counters(METRICS_BEFORE)
    two = one + one
    assert two.uses["device"] == 20.0
    assert two.swaps["load"] == 8.0
    assert two.preemptions == 12.0
    assert two.first_token_turns == 4.0
