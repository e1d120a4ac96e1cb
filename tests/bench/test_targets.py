"""The issue's targets evaluated on samples: verdicts follow the median over rounds,
intervals say whether the verdict is resolved, absent systems are not measured."""

from __future__ import annotations

import pytest

from bench.client import RequestRecord
from bench.config import (
    FLOOD,
    GATEWAY,
    GATEWAY_FCFS,
    ONE_ADAPTER,
    SOLO,
    VLLM,
    cliff_point,
    many_adapters_point,
    saturation_point,
)
from bench.stats import ACTIVATIONS, LOADS, Sample
from bench.targets import evaluate, pairs

A16 = saturation_point(16)
MANY = many_adapters_point(1000)


def sample(
    system: str, point: str, round_: int, *, ttft: float = 0.1, wall: float = 10.0,
    count: int = 20, swaps: tuple[float, float] | None = None, errors: int = 0,
) -> Sample:  # fmt: skip
    records = tuple(
        RequestRecord(
            system, point, i, 0, "m", 0.0, 0.0, ttft=ttft * (1 + i / count), itl=[0.01] * 9,
            e2e=ttft + 0.09, output_tokens=10, status=200,
            error="HTTP 500" if i < errors else None,
        )
        for i in range(count)
    )  # fmt: skip
    counters = {LOADS: swaps[0], ACTIVATIONS: swaps[1]} if swaps is not None else {}
    return Sample(system, point, round_, records, wall, counters)


def run(**walls: float) -> list[Sample]:
    """Three rounds of every point: the gateway's walls as given (vLLM's 10 s)."""
    samples = []
    for r in range(3):
        samples += [
            sample(GATEWAY, A16, r, wall=walls.get("gateway", 10.0), swaps=(3.0, 5.0)),
            sample(GATEWAY_FCFS, A16, r, swaps=(2.0, walls.get("fcfs_activations", 20.0))),
            sample(VLLM, A16, r, wall=10.0 + (r - 1) * 0.2),
            sample(GATEWAY, SOLO, r, ttft=0.1),
            sample(GATEWAY, FLOOD, r, ttft=walls.get("flood_ttft", 0.15)),
            sample(GATEWAY_FCFS, SOLO, r, ttft=0.1),
            sample(GATEWAY_FCFS, FLOOD, r, ttft=3.0),
            sample(GATEWAY, ONE_ADAPTER, r, wall=10.0),
            sample(GATEWAY, MANY, r, wall=walls.get("many", 12.0)),
        ]
    return samples


def test_all_targets_met_and_resolved() -> None:
    results = evaluate(run(), (16,), 1000, seed=0, draws=400)
    verdicts = [(r.verdict, r.resolved) for r in results]
    names = [r.name for r in results]
    assert names[0].startswith("Noisy neighbour") and "scheduler" in names[0]
    assert verdicts[0] == ("met", True)  # 0.15 / 0.1 = 1.5x <= 2x
    assert results[1].verdict == "reported" and "FCFS (gateway-fcfs)" in names[1]
    assert results[1].estimate is not None and results[1].estimate.median is not None
    assert results[1].estimate.median > 20
    throughput, activations, loads, many, cost = results[2:]
    # vLLM's walls are 9.8, 10, 10.2 s: the gateway's 10 s gives 0.98, 1.0, 1.02.
    assert throughput.estimate is not None and throughput.estimate.median == 1.0
    assert throughput.verdict == "met" and not throughput.resolved
    assert "activations" in activations.name and "<= 0.7x" in activations.name
    assert activations.verdict == "met" and activations.resolved
    assert activations.estimate is not None and activations.estimate.median == 0.25
    assert loads.verdict == "reported" and loads.estimate is not None
    assert loads.estimate.median == 1.5
    assert many.verdict == "met" and many.estimate is not None
    assert abs(many.estimate.median - 10 / 12) < 1e-9
    assert cost.verdict == "not measured"


def test_targets_missed() -> None:
    walls = {"gateway": 11.0, "flood_ttft": 0.3, "many": 20.0, "fcfs_activations": 6.0}
    results = evaluate(run(**walls), (16,), 1000, 0, 400)
    assert results[0].verdict == "missed" and results[0].resolved  # 3x > 2x
    assert results[2].verdict == "missed"  # 10/11 < 1.0
    assert results[3].verdict == "missed"  # 5/6 activations > 0.7
    assert results[5].verdict == "missed"  # 10/20 < 0.7
    assert "**missed**" in results[0].row()


def test_errors_miss_the_many_adapters_target() -> None:
    samples = [s for s in run() if s.point != MANY]
    samples += [sample(GATEWAY, MANY, r, wall=10.0, errors=1 if r == 2 else 0) for r in range(3)]
    many = evaluate(samples, (16,), 1000, 0, 200)[5]
    assert many.verdict == "missed" and "errors: 1" in many.detail


def test_absent_systems_are_not_measured() -> None:
    quick = [s for s in run() if s.system in (GATEWAY, VLLM) and s.point in (A16, SOLO, FLOOD)]
    results = evaluate(quick, (16,), 0, 0, 200)
    assert [r.verdict for r in results] == ["met", "met", "not measured", "not measured",
                                            "not measured"]  # fmt: skip
    assert "not measured" in results[2].row()


def test_pairs_match_rounds() -> None:
    samples = [sample(GATEWAY, A16, 0), sample(GATEWAY, A16, 1), sample(VLLM, A16, 1)]
    matched = pairs(samples, (GATEWAY, A16), (VLLM, A16))
    assert [(x.round, y.round) for x, y in matched] == [(1, 1)]


def test_one_round_never_resolves_a_verdict() -> None:
    one_round = [s for s in run() if s.round == 0]
    noisy = evaluate(one_round, (16,), 1000, 0, 200)[0]
    assert noisy.verdict == "met" and not noisy.resolved
    assert "(unresolved)" in noisy.row()


def test_an_undefined_ratio_is_missed_and_says_why() -> None:
    samples = [
        sample(system, A16, r, swaps=(0.0, 0.0))
        for r in range(3)
        for system in (GATEWAY, GATEWAY_FCFS)
    ]
    swaps = evaluate(samples, (16,), 0, 0, 100)[2]
    assert swaps.verdict == "missed" and swaps.detail.startswith("no ratio")


def test_the_cliff_targets_compare_the_gateways_p99_with_its_own_at_slots() -> None:
    samples = []
    for r in range(3):
        samples += [
            sample(GATEWAY, cliff_point("zipf", 4, 4), r, ttft=0.1),
            sample(GATEWAY, cliff_point("zipf", 8, 4), r, ttft=0.19),  # 1.9x: met
            sample(GATEWAY, cliff_point("zipf", 32, 4), r, ttft=0.5),  # 5x: missed
            sample(GATEWAY_FCFS, cliff_point("zipf", 32, 4), r, ttft=0.1),  # not the gateway
            sample(GATEWAY, cliff_point("uniform", 8, 4), r, ttft=0.3),  # 3x the shared 1x
        ]
    results = evaluate(samples, (16,), 0, 0, 200, cliff=(("zipf", "uniform"), 4))
    cliff = [r for r in results if r.name.startswith("Cliff")]
    assert [r.name for r in cliff] == [
        "Cliff, zipf: TTFT p99 over 2x slots / over adapters = slots, gateway (<= 2x)",
        "Cliff, zipf: TTFT p99 over 8x slots / over adapters = slots, gateway (<= 4x)",
        "Cliff, uniform: TTFT p99 over 2x slots / over adapters = slots, gateway (<= 2x)",
        "Cliff, uniform: TTFT p99 over 8x slots / over adapters = slots, gateway (<= 4x)",
    ]
    assert [r.verdict for r in cliff] == ["met", "missed", "missed", "not measured"]
    assert cliff[1].estimate is not None and cliff[1].estimate.median == pytest.approx(5.0)
    assert not any(r.name.startswith("Cliff") for r in evaluate(samples, (16,), 0, 0, 200))
