"""The scenarios against a fake system over the tiny streaming server: the points they
produce, the adapter swaps read from the system's metrics around each point, and the
noisy neighbour's flood (B measured alone, then while A's streams flow)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from app.settings import Settings
from bench.client import Call
from bench.config import FLOOD, SOLO, BenchConfig, saturation_point
from bench.random_adapters import BenchAdapter
from bench.scenarios import FLOOD_COMPLETED, noisy_neighbour, saturation
from bench.stats import SWAPS
from bench.systems import EngineConfig
from bench.workload import PlannedRequest
from tests.bench.stream_server import serving

ADAPTERS = [BenchAdapter(f"bench-{i:03d}", 8, Path(f"/nowhere/{i}")) for i in range(3)]


def swaps(load: int, activate: int) -> str:
    return (
        "# TYPE lora_gateway_adapter_swap_seconds histogram\n"
        f'lora_gateway_adapter_swap_seconds_count{{stage="load"}} {load}.0\n'
        f'lora_gateway_adapter_swap_seconds_count{{stage="activate"}} {activate}.0\n'
    )


class FakeSystem:
    def __init__(self, base_url: str, scrapes: Sequence[str | None]) -> None:
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
    config = BenchConfig(adapters=3, concurrencies=(2, 3), waves=2)
    async for server, url in serving(0.01):
        system = FakeSystem(url, [swaps(1, 0), swaps(5, 2), swaps(5, 2), swaps(5, 3)])
        samples = await saturation(system, ADAPTERS, config, 0, lambda _: None)
        assert [(s.point, len(s.records), s.errors) for s in samples] == [
            (saturation_point(2), 4, 0),
            (saturation_point(3), 6, 0),
        ]
        assert [s.counters[SWAPS] for s in samples] == [6.0, 1.0]
        assert server.most_open <= 3
        # The mix's adapters, drawn for the closed loop.
        assert {p.adapter for p in system.calls} <= {None, 0, 1, 2}


async def test_noisy_neighbour_measures_b_alone_then_under_the_flood() -> None:
    config = BenchConfig(adapters=3, flood_streams=5, victim_requests=3)
    async for server, url in serving(0.02):
        system = FakeSystem(url, [None] * 4)
        solo, flood = await noisy_neighbour(system, ADAPTERS, config, 1, lambda _: None)
        assert (solo.point, flood.point, flood.round) == (SOLO, FLOOD, 1)
        assert len(solo.records) == len(flood.records) == 3
        assert all(r.ok for r in solo.records + flood.records)
        assert SWAPS not in flood.counters  # a system without swap metrics
        assert flood.counters[FLOOD_COMPLETED] >= 1
        # A's five streams and B's one were open at once.
        assert server.most_open >= 6
        tenants = {p.tenant for p in system.calls}
        assert tenants == {0, 1}
