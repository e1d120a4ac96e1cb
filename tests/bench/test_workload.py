"""The benchmark's workload plans: deterministic, Poisson-timed, Zipf-shaped; closed-loop
sequences and single-tenant requests."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import replace

import pytest

from bench.workload import (
    PROMPTS,
    Mix,
    WorkloadSpec,
    closed_plan,
    plan,
    tenant_requests,
    zipf_weights,
)

SPEC = WorkloadSpec(
    rate=20.0, duration=500.0, adapters=16, zipf=1.0, base_share=0.25, output_tokens=32, seed=7
)


def test_the_same_spec_gives_the_same_plan() -> None:
    assert plan(SPEC) == plan(SPEC)
    assert plan(SPEC) != plan(replace(SPEC, seed=8))


def test_arrivals_are_poisson_at_the_set_rate() -> None:
    requests = plan(SPEC)
    expected = SPEC.rate * SPEC.duration  # 10 000; Poisson sd = 100
    assert abs(len(requests) - expected) < 4 * math.sqrt(expected)
    gaps = [b.at - a.at for a, b in itertools.pairwise(requests)]
    mean = sum(gaps) / len(gaps)
    # Exponential gaps: mean 1/rate and standard deviation equal to the mean.
    sd = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps))
    assert mean == pytest.approx(1 / SPEC.rate, rel=0.05)
    assert sd == pytest.approx(mean, rel=0.05)
    assert all(0 <= r.at < SPEC.duration for r in requests)
    assert [r.at for r in requests] == sorted(r.at for r in requests)
    assert [r.index for r in requests] == list(range(len(requests)))


def test_base_share_is_respected() -> None:
    requests = plan(SPEC)
    share = sum(r.adapter is None for r in requests) / len(requests)
    assert share == pytest.approx(SPEC.base_share, abs=0.02)


def test_adapter_popularity_follows_zipf() -> None:
    requests = [r for r in plan(SPEC) if r.adapter is not None]
    counts = Counter(r.adapter for r in requests)
    weights = zipf_weights(SPEC.adapters, SPEC.zipf)
    for adapter in (0, 1, 3, 15):
        assert counts[adapter] / len(requests) == pytest.approx(weights[adapter], abs=0.015)
    # Zipf with exponent 1: the most popular adapter is called about twice as
    # often as the second and about four times as often as the fourth.
    assert counts[0] / counts[1] == pytest.approx(2.0, rel=0.15)
    assert counts[0] / counts[3] == pytest.approx(4.0, rel=0.2)


def test_zipf_weights_are_normalised_and_flat_at_exponent_zero() -> None:
    assert sum(zipf_weights(128, 1.2)) == pytest.approx(1.0)
    assert zipf_weights(4, 0.0) == pytest.approx([0.25] * 4)


def test_adapter_requests_come_from_their_own_tenant() -> None:
    for request in plan(SPEC):
        assert request.prompt in PROMPTS
        assert request.max_tokens == SPEC.output_tokens
        assert 0 <= request.tenant < SPEC.adapters
        if request.adapter is not None:
            assert request.tenant == request.adapter


def test_base_model_only_workload() -> None:
    requests = plan(replace(SPEC, adapters=0, base_share=1.0, duration=10.0))
    assert requests and all(r.adapter is None and r.tenant == 0 for r in requests)


def test_one_parameter_does_not_reshuffle_the_others() -> None:
    # Arrival times are drawn independently of the adapter mix.
    a = plan(SPEC)
    b = plan(replace(SPEC, base_share=0.5, adapters=4))
    assert [r.at for r in a] == [r.at for r in b]


@pytest.mark.parametrize(
    "change",
    [{"rate": 0}, {"duration": -1}, {"base_share": 1.5}, {"adapters": 0}, {"output_tokens": 0}],
)
def test_invalid_specs_are_refused(change: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        replace(SPEC, **change)


def test_closed_plan_draws_the_same_mix_without_arrival_times() -> None:
    mix = Mix(adapters=16, zipf=1.0, base_share=0.25, output_tokens=32, seed=7)
    requests = closed_plan(mix, 4000)
    assert requests == closed_plan(mix, 4000)
    assert requests != closed_plan(replace(mix, seed=8), 4000)
    assert all(r.at == 0.0 for r in requests)
    assert [r.index for r in requests] == list(range(4000))
    # The same draws as the open-loop plan of the same mix, request by request.
    assert [r.adapter for r in requests[:50]] == [
        r.adapter for r in plan(WorkloadSpec(16, 1.0, 0.25, 32, 7, rate=20.0, duration=50.0))[:50]
    ]
    adapted = [r.adapter for r in requests if r.adapter is not None]
    counts = Counter(adapted)
    assert counts[0] / len(adapted) == pytest.approx(zipf_weights(16, 1.0)[0], abs=0.03)
    assert sum(r.adapter is None for r in requests) / 4000 == pytest.approx(0.25, abs=0.03)
    with pytest.raises(ValueError):
        closed_plan(mix, 0)


def test_tenant_requests_are_one_tenant_on_one_model() -> None:
    requests = tenant_requests(5, tenant=1, adapter=1, output_tokens=8, seed=0)
    assert [(r.tenant, r.adapter, r.max_tokens) for r in requests] == [(1, 1, 8)] * 5
    assert requests == tenant_requests(5, tenant=1, adapter=1, output_tokens=8, seed=0)
    assert all(r.prompt in PROMPTS for r in requests)
