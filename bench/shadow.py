"""What shadow traffic costs the tenant it copies: `python -m bench.shadow`.

One gateway, one tenant calling one alias at a fixed open-loop rate: the alias pinned to one
version (no shadow), then the same alias shadowed at 100% on a second version (every request
run again on it, its answer discarded), alternated for ``--rounds`` rounds with the same
arrivals. Prints the tenant's TTFT p99 (and p50) with shadows over without, the median over
rounds with its bootstrap interval; the target is at most 1.1x (docs/rollouts.md).
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from app.settings import Settings
from bench.client import run_workload
from bench.random_adapters import BenchAdapter, ensure_bench_adapters
from bench.runner import warm_up
from bench.stats import TTFT_P50, TTFT_P99, Sample, ratio_estimate
from bench.systems import ADMIN_HEADERS, EngineConfig, GatewaySystem
from bench.workload import WorkloadSpec, plan

OFF, ON = "no shadow", "shadow 100%"
TARGET = 1.1


async def grant(system: GatewaySystem, alias: str, shadow: bool) -> None:
    """Pin ``alias`` to its version 1; with ``shadow``, shadow every request on version 2."""
    body: dict[str, object] = {"adapter": alias, "version": 1}
    if shadow:
        body["shadow"] = {"version": 2, "percent": 100}
    async with httpx.AsyncClient(headers=ADMIN_HEADERS, timeout=60) as admin:
        response = await admin.put(
            f"{system.base_url}/admin/v1/tenants/tenant-000/adapters/{alias}", json=body
        )
        response.raise_for_status()


async def shadow_outcomes(system: GatewaySystem) -> Counter[str]:
    """``lora_gateway_shadow_requests_total`` by status, summed over tenants and models."""
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(await system.metrics_text() or ""):
        for sample in family.samples:
            if sample.name == "lora_gateway_shadow_requests_total":
                counts[sample.labels["status"]] += int(sample.value)
    return counts


async def settled_shadows(system: GatewaySystem, before: Counter[str], requests: int) -> str:
    """Wait until every request's shadow has ended (so that none runs into the next
    phase); how they ended."""
    while True:
        ended = await shadow_outcomes(system) - before
        if sum(ended.values()) >= requests:
            return ", ".join(f"{n} {status}" for status, n in sorted(ended.items()))
        await asyncio.sleep(0.5)


async def measure(
    system: GatewaySystem, adapters: Sequence[BenchAdapter], spec: WorkloadSpec, point: str
) -> Sample:
    records, wall = await run_workload(
        system.base_url, system.name, point, plan(spec),
        lambda p: system.call_for(p, adapters), drain_seconds=120.0,
    )  # fmt: skip
    return Sample(system.name, point, spec.seed, tuple(records), wall, {})


async def main(args: argparse.Namespace) -> None:
    settings = Settings()
    model = Path(settings.model)
    work = args.out / f"shadow-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"
    work.mkdir(parents=True, exist_ok=True)
    # Two adapters on disk: the first is the alias's version 1, the second its version 2.
    first, second = await asyncio.to_thread(ensure_bench_adapters, model, args.adapters, 2)
    system = GatewaySystem(EngineConfig(settings), args.adapters, work, tenants=1)
    await system.start([first], work / "gateway.log")
    try:
        async with httpx.AsyncClient(headers=ADMIN_HEADERS, timeout=300) as admin:
            path = str(second.path.resolve().relative_to(args.adapters.resolve()))
            registered = await admin.post(
                f"{system.base_url}/admin/v1/adapters", json={"name": first.name, "path": path}
            )
            registered.raise_for_status()
        await warm_up(system, [first])
        pairs = []
        for round_ in range(args.rounds):
            spec = WorkloadSpec(
                adapters=1, zipf=0.0, base_share=0.0, output_tokens=args.output_tokens,
                rate=args.rate, duration=args.duration, seed=round_,
            )  # fmt: skip
            samples = {}
            # Alternate which goes first, so neither always runs on a warmer engine.
            for shadow in (False, True) if round_ % 2 == 0 else (True, False):
                await grant(system, first.name, shadow)
                await asyncio.sleep(2 * settings.registry_poll_seconds)
                before = await shadow_outcomes(system)
                samples[shadow] = sample = await measure(
                    system, [first], spec, ON if shadow else OFF
                )
                shadows = (
                    await settled_shadows(system, before, len(sample.records)) if shadow else "-"
                )
                errors = sum(not r.ok for r in sample.records)
                p99 = (TTFT_P99.of(sample) or float("nan")) * TTFT_P99.scale
                print(
                    f"round {round_} {sample.point}: {len(sample.records)} requests, "
                    f"{errors} errors, TTFT p99 {p99:.0f} ms; shadows: {shadows}"
                )
            pairs.append((samples[True], samples[False]))
    finally:
        await asyncio.to_thread(system.stop)
    for figure in (TTFT_P50, TTFT_P99):
        estimate = ratio_estimate(figure, pairs, seed=0)
        print(f"{figure.label}, shadow 100% / no shadow: {estimate.text()}")
    ratio = ratio_estimate(TTFT_P99, pairs, seed=0).median
    verdict = "met" if ratio is not None and ratio <= TARGET else "MISSED"
    print(f"target TTFT p99 <= {TARGET}x: {verdict}")


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=1.0, help="requests per second")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals")
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--adapters", type=Path, default=Path("var/bench/adapters"))
    parser.add_argument("--out", type=Path, default=Path("var/bench"))
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
