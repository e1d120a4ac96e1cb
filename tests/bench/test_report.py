"""The written report: every figure with its ratio and interval, the scenario
tables, the targets table, the JSON twin, the warm-up plan and the curve's rates."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench.client import RequestRecord
from bench.config import (
    FLOOD,
    GATEWAY,
    ONE_ADAPTER,
    SOLO,
    SYSTEMS,
    VLLM,
    VLLM_SHIPPED,
    BenchConfig,
    cliff_point,
    cliff_saturation_point,
    curve_point,
    many_adapters_point,
    saturation_point,
)
from bench.report import NOT_COUNTABLE, SHIPPED_NOTE, render_markdown, summary_json, write_requests
from bench.runner import curve_rates, planned_requests, warmup_plan
from bench.stats import ACTIVATION_SECONDS, ACTIVATIONS, LOAD_SECONDS, LOADS, Sample
from bench.targets import evaluate

A16 = saturation_point(16)
MANY = many_adapters_point(1000)
CONTEXT = {
    "command": "python -m bench", "started": "now", "wall_seconds": 1.0, "machine": "test",
    "engine": "e", "workload": "w", "rounds": 2,
    "systems": ["gateway", "vllm", "vllm-shipped"], "order": ["gateway", "vllm"], "seed": 0,
    "draws": 200, "flood_streams": 100, "registered_max_loras": 16, "curve_rates": {0.5: 0.2},
}  # fmt: skip


def sample(system: str, point: str, round_: int, *, wall: float = 10.0, ttft: float = 0.1,
           swaps: float | None = None) -> Sample:  # fmt: skip
    records = tuple(
        RequestRecord(system, point, i, 0, "m", 0.0, 0.0, ttft=ttft, itl=[0.05] * 31,
                      e2e=ttft + 1.55, output_tokens=32, status=200)
        for i in range(4)
    )  # fmt: skip
    # ``swaps`` loads of 0.5 s and twice as many activations of 10 ms.
    counters = (
        {LOADS: swaps, LOAD_SECONDS: swaps * 0.5, ACTIVATIONS: 2 * swaps,
         ACTIVATION_SECONDS: 2 * swaps * 0.01}
        if swaps else {}
    )  # fmt: skip
    return Sample(system, point, round_, records, wall, counters)


def samples() -> list[Sample]:
    out = []
    for r in range(2):
        out += [
            sample(GATEWAY, A16, r, wall=10.0, swaps=2.0),
            sample(VLLM, A16, r, wall=12.8),
            sample(VLLM_SHIPPED, A16, r, wall=25.6),
            sample(GATEWAY, curve_point(0.5), r, ttft=0.2),
            sample(VLLM, curve_point(0.5), r, ttft=0.1),
            sample(GATEWAY, SOLO, r, ttft=0.1),
            sample(GATEWAY, FLOOD, r, ttft=0.12),
            sample(VLLM, SOLO, r, ttft=0.1),
            sample(VLLM, FLOOD, r, ttft=4.0),
            sample(GATEWAY, ONE_ADAPTER, r, wall=10.0),
            sample(GATEWAY, MANY, r, wall=12.5),
        ]
    return out


def test_the_report_shows_every_figure_with_its_ratio_and_the_targets() -> None:
    data = samples()
    targets = evaluate(data, (16,), 1000, seed=0, draws=200)
    text, ratios = render_markdown(data, targets, CONTEXT, MANY)
    # Saturation: 128 tokens in 10 s against 12.8 s and 25.6 s: 12.80, 10.00, 5.00 tok/s.
    assert f"## {A16}" in text
    assert "| figure | gateway | vllm | vllm-shipped | gateway / vllm [95%] " in text
    assert "| output tok/s | 12.80 | 10.00 | 5.00 | 1.280 [1.280, 1.280] | 0.500 [" in text
    assert "| adapter loads per 100 requests | 50.0 | - | - | - | - |" in text
    assert "| adapter activations per 100 requests | 100.0 | - | - | - | - |" in text
    assert "| engine time per adapter load (ms) | 500.0 | - | - | - | - |" in text
    assert "| engine time per adapter activation (ms) | 10.0 | - | - | - | - |" in text
    assert NOT_COUNTABLE in text and SHIPPED_NOTE in text
    assert (
        "- systems: gateway, vllm, vllm-shipped; 2 round(s), interleaved (run order "
        "gateway -> vllm); scenario c on the gateway alone, after them" in text
    )
    assert "- open-loop rates (share of the first saturation measured): 50%: 0.200 req/s" in text
    assert "| TTFT p50 (ms) | 200.0 | 100.0 | 2.000 [2.000, 2.000] |" in text
    # Noisy neighbour: the ratio of B's p99 under the flood to alone, per system.
    assert "| gateway | 100.0 | 100.0 | 120.0 | 120.0 | 1.200 [1.200, 1.200] | 0 / 0 | 0 |" in text
    assert "| vllm | 100.0 | 100.0 | 4000.0 | 4000.0 | 40.000 [" in text
    assert "| ratio (many / one) [95%] | 0.800 [0.800, 0.800] | | |" in text
    assert "## Targets" in text
    assert (
        "| Noisy neighbour: B's p99 TTFT under A's flood / B's solo p99, scheduler (<= 2x) "
        "| met | 1.200 [1.200, 1.200] (resolved) |" in text
    )
    assert "| **missed** | 0.800" not in text  # 0.8 >= 0.7: met
    assert ratios[A16]["vllm-shipped"]["output_tps"]["median"] == pytest.approx(0.5)
    doc = summary_json(data, targets, CONTEXT, ratios)
    json.dumps(doc)  # serialisable as written
    first = doc["samples"][0]
    assert first["figures"]["output_tps"] == pytest.approx(12.8)
    assert first["counters"][LOADS] == 2.0 and first["counters"][ACTIVATIONS] == 4.0
    assert first["figures"]["activations_per_100"] == pytest.approx(100.0)
    assert [t["verdict"] for t in doc["targets"]][:2] == ["met", "reported"]


def test_without_vllm_shipped_there_is_no_note(tmp_path: Path) -> None:
    data = [s for s in samples() if s.system != VLLM_SHIPPED]
    text, _ = render_markdown(data, [], CONTEXT, None)
    assert SHIPPED_NOTE not in text and "against 1 adapter" not in text
    write_requests(tmp_path / "r.jsonl", data)
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert len(lines) == 4 * len(data)
    assert json.loads(lines[0])["round"] == 0


def test_curve_rates_are_shares_of_the_first_saturation() -> None:
    config = BenchConfig(concurrencies=(16, 64), curve_fractions=(0.5, 1.0))
    first = sample(VLLM, saturation_point(64), 0, wall=2.0)  # 4 requests in 2 s
    later = sample(GATEWAY, saturation_point(64), 0, wall=1.0)
    rates = curve_rates(config, [sample(VLLM, A16, 0), first, later])
    assert rates == pytest.approx({0.5: 1.0, 1.0: 2.0})


def test_planned_requests_count_every_visit() -> None:
    quick = BenchConfig.quick()
    assert planned_requests(quick) == 2 * (quick.waves * 16 + 2 * quick.victim_requests)
    full = BenchConfig(registered=0, curve_fractions=(), rounds=1)
    a_b = full.waves * 80 + 2 * full.victim_requests
    d = full.waves * full.cliff_concurrency + full.cliff_requests * 5  # 1x measured once
    assert planned_requests(full) == 3 * a_b + 3 * d
    every = dataclasses.replace(full, systems=SYSTEMS)
    assert planned_requests(every) == 4 * a_b + 3 * d  # no cliff for vllm-shipped


def test_warmup_touches_the_host_cached_adapters_in_order_a_group_at_a_time() -> None:
    batches = warmup_plan(adapters=10, group=4, cached=8)
    assert [r.adapter for r in batches[0]] == [None]
    assert [[r.adapter for r in b] for b in batches[1:]] == [[2, 3, 4, 5], [6, 7, 8, 9]]
    assert [[r.adapter for r in b] for b in warmup_plan(3, 4, 8)[1:]] == [[0, 1, 2]]


def test_the_cliff_has_a_table_per_point_with_the_gateways_ratio_to_its_own_at_slots() -> None:
    data = []
    for r in range(2):
        for system, slow in ((GATEWAY, 1.0), (VLLM, 3.0)):
            paused = sample(system, cliff_point("zipf", 8, 4), r, ttft=0.15 * slow)
            if system == GATEWAY:
                for record in paused.records:
                    record.itl[5] = 2.0
            data += [
                sample(system, cliff_saturation_point(4), r, wall=2.0),
                sample(system, cliff_point("zipf", 4, 4), r, ttft=0.1),
                paused,
            ]
    context = {
        **CONTEXT, "cliff_rates": {0: 1.25, 1: 1.5}, "cliff": "zipf over 1x, 2x the slots",
        "config": {"max_loras": 4},
    }  # fmt: skip
    text, _ = render_markdown(data, [], context, None)
    assert "## d: the cold-start cliff" in text
    assert "zipf over 1x, 2x the slots; offered rates: round 1: 1.250 req/s, round 2: 1.500" in text
    columns = "TTFT p50 / p99 (ms) | {0}: end-to-end p50 (ms) | {0}: longest gap p99 (ms) | {0}"
    assert (
        f"| point | gateway: {columns.format('gateway')}: output tok/s | vllm: "
        f"{columns.format('vllm')}: output tok/s | gateway: p99 / p99 at slots [95%] |" in text
    )
    # Every stream's tokens 50 ms apart, but one gap of 2 s in the gateway's at 2x.
    assert (
        f"| {cliff_point('zipf', 4, 4)} | 100.0 / 100.0 | 1650.0 | 50.0 | 12.80 "
        "| 100.0 / 100.0 | 1650.0 | 50.0 | 12.80 |  |" in text  # the baseline: no ratio
    )
    assert (
        f"| {cliff_point('zipf', 8, 4)} | 150.0 / 150.0 | 1700.0 | 2000.0 | 12.80 "
        "| 450.0 / 450.0 | 2000.0 | 50.0 | 12.80 | 1.500" in text
    )
    assert f"## {cliff_point('zipf', 8, 4)}" not in text  # not a table of its own
