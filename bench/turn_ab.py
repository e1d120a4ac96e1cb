"""``python -m bench.turn_ab``: what the slot turns cost and save, on one gateway.

The grid (:mod:`bench.grid_run`) compares the gateway with vLLM's server; between two
processes, and on a shared machine, a point moves by more than a turn rule changes it. This
runs one grid point on one gateway process, its tenants' objectives switched over the admin
API between runs: *with turns* the objectives given (a grid run's, from its summary), and
*without* objectives no request can reach, so no turn is ever due and the engine schedules
as vLLM's own scheduler does. The runs go with, without, without, with (each pair), so that
a drift of the machine weighs on both alike, and every run is counted against the given
objectives: what the turns saved (first tokens within the TTFT objective) against what they
broke (streams past the TPOT objective). Beside each run, what the engine computed
(``vllm:iteration_tokens_total``: tokens and steps) and each process's CPU, so that a turn's
cost in throughput is told from the machine's.

With ``--against vllm`` the other arm is vLLM's server with the same ops, up beside the
gateway for the whole run: one grid point, both systems, paired the same way, where the grid
has one sample of each a round.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import psutil

from app.settings import Settings
from app.tenancy.manifests import MAX_OBJECTIVE_MS
from bench.__main__ import settings_pairs
from bench.grid import POPULARITIES, TARGETS, GridConfig, GridPoint, Load
from bench.grid_run import adapter_pools, append_samples, grid_engine, run_point
from bench.insitu import server_processes
from bench.prompts import SizedPrompts
from bench.runner import warm_up
from bench.stats import (
    ENGINE_STEPS,
    ENGINE_TOKENS,
    GOODPUT,
    HEADROOM_SEATS,
    OUTPUT_TPS,
    SLO_TPOT,
    SLO_TTFT,
    TURNS,
    Sample,
    met_objectives,
)
from bench.status import StatusLine
from bench.systems import GatewaySystem, System, VLLMServer

WITH, WITHOUT, VLLM_SERVER = "with turns", "without", "vLLM's server"
AGAINST = {"without": WITHOUT, "vllm": VLLM_SERVER}
# Objectives no request reaches: no turn is ever due (whole milliseconds, as a tenant's; the
# most the admin API takes, a day).
UNREACHABLE_MS = MAX_OBJECTIVE_MS
CPU = "cpu_seconds_"  # + the process's name


def run_order(pairs: int, other: str = WITHOUT) -> list[str]:
    """With, the other, the other, with: each pair's drift weighs on both alike."""
    return [WITH, other, other, WITH] * pairs


def cpu_seconds(system: System) -> dict[str, float]:
    """User and system CPU of each of the system's processes, so far."""
    seconds = {}
    for name, pid in server_processes(system):
        times = psutil.Process(pid).cpu_times()
        seconds[name] = times.user + times.system
    return seconds


def misses(sample: Sample) -> tuple[int, int]:
    """The requests past the TTFT objective (or failed), and those within it past the TPOT
    objective."""
    ttft = sample.counters[SLO_TTFT]
    late = sum(not r.ok or r.ttft is None or r.ttft > ttft for r in sample.records)
    return late, sum(not met_objectives(r, sample) for r in sample.records) - late


def render(
    samples: Sequence[Sample], point: str, ttft_ms: int, tpot_ms: int, other: str = WITHOUT
) -> str:
    lines = [
        f"# Slot turns on one gateway, with turns and {other}",
        "",
        f"{point}; objectives TTFT {ttft_ms} ms, TPOT {tpot_ms} ms (every run counted "
        "against them).",
        "",
        "| run | turns | headroom seats | output tok/s | within both | TTFT missed "
        "| TPOT missed | engine tokens / steps | CPU s (server, core, worker) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for sample in samples:
        late, broken = misses(sample)
        met = sum(bool(met_objectives(r, sample)) for r in sample.records)
        c = sample.counters
        cpu = ", ".join(f"{v:.1f}" for k, v in c.items() if k.startswith(CPU))
        steps = c.get(ENGINE_STEPS)
        work = f"{c[ENGINE_TOKENS]:.0f} / {steps:.0f}" if steps else "-"
        lines.append(
            f"| {sample.point} | {c.get(TURNS, 0.0):.0f} | {c.get(HEADROOM_SEATS, 0.0):.0f} "
            f"| {OUTPUT_TPS.of(sample) or 0.0:.1f} "
            f"| {met} | {late} | {broken} | {work} | {cpu} |"
        )
    ratios = []
    for first in range(0, len(samples) - 3, 4):
        with_, others = samples[first : first + 4 : 3], samples[first + 1 : first + 3]
        goodput = [sum(GOODPUT.of(s) or 0.0 for s in arm) for arm in (with_, others)]
        ratios.append(goodput[0] / goodput[1] if goodput[1] else float("nan"))
    lines += ["", f"Goodput with turns over {other}, per pair: "]
    lines[-1] += ", ".join(f"{r:.2f}x" for r in ratios) or "none"
    return "\n".join(lines) + "\n"


def grid_point(args: argparse.Namespace, config: GridConfig) -> GridPoint:
    """The point the arguments name: an open loop where they give its rate."""
    load = Load(share=config.open_share) if args.rate else Load(args.concurrency)
    return GridPoint(args.targets, args.popularity, args.multiple, load)


async def run(args: argparse.Namespace) -> Path:
    config = GridConfig()
    point = grid_point(args, config)
    load = point.load
    started = datetime.now(timezone.utc)
    out: Path = args.out / f"turn-ab-{started.strftime('%Y%m%dT%H%M%SZ')}"
    (out / "logs").mkdir(parents=True)
    (out / "arguments.json").write_text(json.dumps(sys.argv[1:]) + "\n")
    settings = Settings()
    config = dataclasses.replace(config, only=(point,))
    engine = grid_engine(config, settings)
    name = point.name(config.max_loras)
    adapters = await asyncio.to_thread(adapter_pools, config, Path(settings.model))
    prompts = SizedPrompts(Path(settings.model), config.prompt_tokens)
    other = AGAINST[args.against]
    order = run_order(args.pairs, other)
    per_run = config.closed_requests(load) if load.closed else config.open_requests
    status = StatusLine(len(order) * per_run)
    gateway = GatewaySystem(
        engine, config.adapter_cache / "grid", out / "tmp", extra=dict(args.gateway_settings)
    )
    systems: dict[str, System] = {WITH: gateway, other: gateway}
    started_systems: list[System] = [gateway]
    if other == VLLM_SERVER:
        systems[other] = VLLMServer(engine)
        started_systems.append(systems[other])
    objectives = {WITH: (args.ttft_ms, args.tpot_ms), WITHOUT: (UNREACHABLE_MS,) * 2}
    samples: list[Sample] = []
    try:
        for system in started_systems:
            await system.start(adapters, out / "logs" / f"{system.name}.log")
            await warm_up(system, adapters)
        for number, arm in enumerate(order):
            system = systems[arm]
            if arm in objectives:
                await gateway.set_objectives(*objectives[arm])
            requests = [  # a prompt of its own for every run: no cached prefix
                dataclasses.replace(r, prompt=prompts(f"ab.{number}.{r.index}"))
                for r in config.requests(point, args.rate)
            ]
            cpu_before = cpu_seconds(system)
            sample = await run_point(system, point, requests, adapters, number, arm, status)
            cpu_after = cpu_seconds(system)
            counters = {
                **sample.counters,
                SLO_TTFT: args.ttft_ms / 1000,
                SLO_TPOT: args.tpot_ms / 1000,
                **{CPU + k: cpu_after[k] - cpu_before.get(k, 0.0) for k in cpu_after},
            }
            samples.append(dataclasses.replace(sample, counters=counters))
            append_samples(out / "samples.jsonl", samples[-1:])
    finally:
        status.finish()
        for system in started_systems:
            await asyncio.to_thread(system.stop)
    text = render(samples, name, args.ttft_ms, args.tpot_ms, other)
    (out / "summary.md").write_text(text)
    print(text)
    print(f"results: {out}")
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.turn_ab", description=__doc__)
    parser.add_argument("--targets", choices=TARGETS, default="attention")
    parser.add_argument("--popularity", choices=POPULARITIES, default="uniform")
    parser.add_argument("--multiple", type=int, default=8, help="adapters per device slot")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="an open loop at this many requests a second (a grid run's: its 1x goodput at "
        "the open loop), in place of the closed loop",
    )
    parser.add_argument(
        "--ttft-ms", type=int, required=True, help="TTFT objective (a grid run's summary)"
    )
    parser.add_argument("--tpot-ms", type=int, required=True, help="TPOT objective")
    parser.add_argument("--pairs", type=int, default=1, help="with-other-other-with runs")
    parser.add_argument(
        "--against",
        choices=AGAINST,
        default="without",
        help="the other arm: the same gateway with no objective reachable, or vLLM's server",
    )
    parser.add_argument(
        "--gateway-settings",
        type=settings_pairs,
        default=(),
        help="more LORA_GATEWAY_* settings for the gateway, NAME=VALUE,... (e.g. SCHEDULER=fcfs)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    asyncio.run(run(build_parser().parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
