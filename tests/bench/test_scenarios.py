"""The scenarios against a fake system over the tiny streaming server: the points they
produce, the adapter swaps read from the system's metrics around each point, and the
noisy neighbour's flood (B measured alone, then while A's streams flow)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from app.settings import Settings
from bench.client import Call
from bench.config import (
    FLOOD,
    SOLO,
    BenchConfig,
    cliff_point,
    cliff_saturation_point,
    saturation_point,
)
from bench.random_adapters import BenchAdapter
from bench.scenarios import FLOOD_COMPLETED, cliff, noisy_neighbour, saturation
from bench.stats import (
    ACTIVATION_SECONDS,
    ACTIVATIONS,
    ENGINE_STEPS,
    ENGINE_TOKENS,
    LOAD_SECONDS,
    LOADS,
    PREEMPTIONS,
)
from bench.systems import EngineConfig
from bench.workload import PlannedRequest
from tests.bench.stream_server import serving

ADAPTERS = [BenchAdapter(f"bench-{i:03d}", 8, Path(f"/nowhere/{i}")) for i in range(16)]


def swaps(load: int, activate: int, steps: int = 0) -> str:
    """Exposition text: ``load`` loads of 0.5 s each, ``activate`` activations of 0.01 s, and
    ``steps`` engine steps of 32 tokens each."""
    return (
        "# TYPE vllm:iteration_tokens_total histogram\n"
        f'vllm:iteration_tokens_total_count{{engine="0"}} {steps}.0\n'
        f'vllm:iteration_tokens_total_sum{{engine="0"}} {steps * 32}.0\n'
        "# TYPE lora_gateway_adapter_swap_seconds histogram\n"
        f'lora_gateway_adapter_swap_seconds_count{{stage="load"}} {load}.0\n'
        f'lora_gateway_adapter_swap_seconds_sum{{stage="load"}} {load * 0.5}\n'
        f'lora_gateway_adapter_swap_seconds_count{{stage="activate"}} {activate}.0\n'
        f'lora_gateway_adapter_swap_seconds_sum{{stage="activate"}} {activate * 0.01}\n'
    )


class FakeSystem:
    def __init__(
        self, base_url: str, scrapes: Sequence[str | None], *, counts_adapters: bool = True
    ) -> None:
        self.counts_adapters = counts_adapters
        self.name = "gateway"
        self.base_url = base_url
        self.engine = EngineConfig(Settings())
        self._scrapes: Iterator[str | None] = iter(scrapes)
        self.calls: list[PlannedRequest] = []

    async def start(self, adapters: Sequence[BenchAdapter], log_path: Path) -> float:
        return 0.0

    def call_for(self, planned: PlannedRequest, adapters: Sequence[BenchAdapter]) -> Call:
        self.calls.append(planned)
        return Call("m", None)

    async def metrics_text(self) -> str | None:
        return next(self._scrapes)

    def stop(self) -> None:
        return None


async def test_saturation_counts_the_swaps_around_each_point() -> None:
    config = BenchConfig(adapters=3, concurrencies=(2, 3), waves=2, cliff_multiples=())
    async for server, url in serving(0.01):
        system = FakeSystem(url, [swaps(1, 0), swaps(5, 2), swaps(5, 2), swaps(5, 3)])
        samples = await saturation(system, ADAPTERS, config, 0, lambda _: None)
        assert [(s.point, len(s.records), s.errors) for s in samples] == [
            (saturation_point(2), 4, 0),
            (saturation_point(3), 6, 0),
        ]
        assert [(s.counters[LOADS], s.counters[ACTIVATIONS]) for s in samples] == [(4, 2), (0, 1)]
        assert samples[0].counters[LOAD_SECONDS] == pytest.approx(2.0)
        assert samples[1].counters[ACTIVATION_SECONDS] == pytest.approx(0.01)
        assert server.most_open <= 3
        # The mix's adapters, drawn for the closed loop.
        assert {p.adapter for p in system.calls} <= {None, 0, 1, 2}


async def test_a_system_that_counts_no_adapters_reports_its_engines_steps_alone() -> None:
    config = BenchConfig(adapters=3, concurrencies=(2,), waves=2, cliff_multiples=())
    async for _, url in serving(0.01):
        scrapes = [swaps(1, 0, steps=10), swaps(5, 2, steps=25)]
        vllm = FakeSystem(url, scrapes, counts_adapters=False)
        [sample] = await saturation(vllm, ADAPTERS, config, 0, lambda _: None)
        assert sample.counters == {ENGINE_STEPS: 15, ENGINE_TOKENS: 15 * 32, PREEMPTIONS: 0}
        [sample] = await saturation(FakeSystem(url, scrapes), ADAPTERS, config, 0, lambda _: None)
        assert (sample.counters[ENGINE_STEPS], sample.counters[LOADS]) == (15, 4)


async def test_noisy_neighbour_measures_b_alone_then_under_the_flood() -> None:
    config = BenchConfig(adapters=3, flood_streams=5, victim_requests=3, cliff_multiples=())
    async for server, url in serving(0.02):
        system = FakeSystem(url, [None] * 4)
        solo, flood = await noisy_neighbour(system, ADAPTERS, config, 1, lambda _: None)
        assert (solo.point, flood.point, flood.round) == (SOLO, FLOOD, 1)
        assert len(solo.records) == len(flood.records) == 3
        assert all(r.ok for r in solo.records + flood.records)
        assert LOADS not in flood.counters  # a system without swap metrics
        assert flood.counters[FLOOD_COMPLETED] >= 1
        # A's five streams and B's one were open at once.
        assert server.most_open >= 6
        tenants = {p.tenant for p in system.calls}
        assert tenants == {0, 1}


async def test_the_cliff_measures_saturation_then_each_multiple_at_one_rate() -> None:
    config = BenchConfig(
        adapters=16, max_loras=2, cliff_multiples=(1, 2, 8), cliff_concurrency=3, waves=2,
        cliff_requests=6, cliff_load=0.5,
    )  # fmt: skip
    async for server, url in serving(0.01):
        system = FakeSystem(url, [None] * 28)
        system.engine = EngineConfig(Settings(max_loras=2, max_cpu_loras=4))
        samples, rate = await cliff(
            system, ADAPTERS, config, None, 0, lambda _: None, lambda label: f"prompt {label}"
        )
        assert [s.point for s in samples] == [
            cliff_saturation_point(2),
            "d: 2 adapters on 2 slots",  # once: no adapter waits for a slot either way
            *(cliff_point(p, n, 2) for p in ("zipf", "uniform") for n in (4, 16)),
        ]
        assert all(r.ok for s in samples for r in s.records)
        saturated = samples[0]
        assert len(saturated.records) == 6 and server.most_open <= 16
        # Half the completed req/s of the closed loop over 2 adapters.
        assert rate == pytest.approx(0.5 * 6 / saturated.wall_seconds)
        calls = system.calls
        assert {p.adapter for p in calls[:6]} <= {0, 1}
        assert {p.adapter for p in calls[6:]} - {None} <= set(range(16))
        assert all(p.adapter is not None and p.max_tokens == 64 for p in calls)
        # Each request's prompt is its own: its point and index first.
        assert calls[0].prompt == f"prompt {cliff_saturation_point(2)} #0"
        assert len({p.prompt for p in calls}) == len(calls)

        again, same_rate = await cliff(
            system, ADAPTERS, config, 150.0, 1, lambda _: None, lambda label: label
        )
        assert same_rate == 150.0 and {s.round for s in again} == {1}
