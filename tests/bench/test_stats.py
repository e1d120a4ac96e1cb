"""Benchmark figures: percentiles, summaries, ratios, targets, residency deltas."""

from __future__ import annotations

import pytest

from bench.client import RequestRecord
from bench.stats import check_targets, percentile, ratios, summarize
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


def test_percentile_interpolates_like_numpy() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 5.0
    assert percentile(values, 25) == 2.0
    assert percentile(values, 99) == pytest.approx(4.96)
    assert percentile([1.0, 2.0], 50) == 1.5
    assert percentile([], 50) is None


def test_summary_counts_only_completed_requests_in_figures() -> None:
    records = [
        record(0, ttft=0.1, itl=[0.02, 0.04], tokens=3),
        record(1, ttft=0.3, itl=[0.06], tokens=2),
        record(2, ttft=9.0, itl=[9.0], tokens=2, error="HTTP 500"),
    ]
    summary = summarize(records, wall_seconds=2.0)
    assert (summary.requests, summary.completed, summary.errors) == (3, 2, 1)
    assert summary.requests_per_second == pytest.approx(1.0)
    assert summary.output_tokens_per_second == pytest.approx(2.5)
    assert summary.ttft_p50 == pytest.approx(0.2)
    assert summary.itl_p50 == pytest.approx(0.04)  # pooled gaps 0.02, 0.04, 0.06
    assert summary.e2e_p50 == pytest.approx((0.16 + 0.36) / 2)
    assert summary.mean_output_tokens == pytest.approx(2.5)
    assert summary.mean_prompt_tokens == pytest.approx(20)
    assert summary.start_lag_p99 == pytest.approx(0.01)


def test_ratios_are_ours_over_theirs() -> None:
    ours = summarize([record(0, ttft=0.2, itl=[0.05], tokens=2)], wall_seconds=1.0)
    theirs = summarize([record(0, ttft=0.1, itl=[0.05], tokens=4)], wall_seconds=1.0)
    r = ratios(ours, theirs)
    assert r["output_tokens_per_second"] == pytest.approx(0.5)
    assert r["ttft_p50"] == pytest.approx(2.0)
    assert r["itl_p99"] == pytest.approx(1.0)


def test_no_completed_request_gives_no_ratio() -> None:
    ours = summarize([record(0, ttft=0.2, itl=[], tokens=2, error="boom")], wall_seconds=1.0)
    theirs = summarize([record(0, ttft=0.1, itl=[0.05], tokens=4)], wall_seconds=1.0)
    assert ratios(ours, theirs)["ttft_p50"] is None
    assert ratios(theirs, ours)["output_tokens_per_second"] is None


def test_targets_met_and_missed() -> None:
    theirs = summarize([record(0, ttft=0.100, itl=[0.05], tokens=100)], wall_seconds=1.0)
    close = summarize([record(0, ttft=0.106, itl=[0.05], tokens=98)], wall_seconds=1.0)
    assert [t.met for t in check_targets(close, theirs)] == [True, True, True]
    # 0.96x throughput and a TTFT beyond 1.05 x 100 ms + 2 ms = 107 ms.
    slow = summarize(
        [
            record(0, ttft=0.108, itl=[0.05], tokens=96),
            record(1, ttft=0.108, itl=[], tokens=0, error="x"),
        ],
        wall_seconds=1.0,
    )
    assert [t.met for t in check_targets(slow, theirs)] == [False, False, False]


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
"""


def test_residency_is_the_difference_of_two_scrapes() -> None:
    delta = parse_swap_counters(METRICS_AFTER) - parse_swap_counters(METRICS_BEFORE)
    report = delta.to_json()
    assert report["uses"] == {"device": 10.0, "host": 4.0, "storage": 1.0}
    assert report["device_hit_rate"] == pytest.approx(10 / 15)
    assert report["swaps"]["load"] == 4.0
    assert report["swap_mean_seconds"]["load"] == pytest.approx(0.015)
    assert report["swap_mean_seconds"]["activate"] is None
    # All four new loads fell in the (10 ms, 20 ms] bucket: the median
    # interpolates to its middle, like Prometheus' histogram_quantile.
    assert report["swap_p50_seconds"]["load"] == pytest.approx(0.015)
    assert report["swap_p99_seconds"]["load"] == pytest.approx(0.0199)


def test_residency_of_rounds_adds_up() -> None:
    one = parse_swap_counters(METRICS_AFTER) - parse_swap_counters(METRICS_BEFORE)
    two = one + one
    assert two.uses["device"] == 20.0
    assert two.swaps["load"] == 8.0
    assert two.swap_quantile("load", 0.5) == pytest.approx(0.015)
