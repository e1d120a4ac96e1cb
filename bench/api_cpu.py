"""``python -m bench.api_cpu`` (``make bench-api-cpu``): the CPU that each system's API-server
process spends per output token at saturation on the real engine, the gateway
(``lora-gateway serve``, the engine in its process) against vLLM's OpenAI server with our ops.

The API-server process is the one holding the HTTP server: the process each system starts.
Its engine core (and any worker) runs in processes below it; their CPU is read apart and
reported beside it, never in it. Both API servers hold vLLM's own output processing
(detokenizing, the output queues), so the gateway's figure is what it costs beyond that:
keys, quotas, the ledger, fairness.

Each round starts each system in turn (alternating which goes first), warms it up as
``make bench`` does, then runs scenario (a)'s mix (``bench/config.py``: its adapters, Zipf
popularity, base-model share and output length) in a closed loop at ``--concurrency``, and
reads the API-server process's CPU time (user + system, all its threads; from
``/proc/<pid>/stat`` through psutil) before and after. A round's ratio is the gateway's CPU
per output token over vLLM's server's; the report gives the median over rounds with the
rounds' range, and writes ``bench/results/api-cpu-<time>/summary.{json,md}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil

from app.settings import Settings
from bench.client import run_closed_loop
from bench.config import GATEWAY, VLLM, BenchConfig, saturation_point
from bench.random_adapters import BenchAdapter, ensure_bench_adapters
from bench.runner import build_system, scenario_engine, warm_up
from bench.systems import EngineConfig, System
from bench.workload import closed_plan

SYSTEMS = (GATEWAY, VLLM)


@dataclass(frozen=True)
class CpuSample:
    """One system's measured closed loop: the API-server process's CPU and its children's,
    over what the clients received."""

    system: str
    round: int
    api_user_seconds: float
    api_system_seconds: float
    engine_seconds: float  # the processes below the API server (engine core, workers)
    output_tokens: int
    requests: int
    errors: int
    wall_seconds: float

    @property
    def api_us_per_token(self) -> float:
        return (self.api_user_seconds + self.api_system_seconds) / self.output_tokens * 1e6

    @property
    def api_system_us_per_token(self) -> float:
        return self.api_system_seconds / self.output_tokens * 1e6

    @property
    def engine_us_per_token(self) -> float:
        return self.engine_seconds / self.output_tokens * 1e6

    @property
    def tokens_per_second(self) -> float:
        return self.output_tokens / self.wall_seconds if self.wall_seconds else 0.0


def api_server_times(pid: int) -> tuple[float, float]:
    """CPU seconds so far of process ``pid`` itself, all its threads, none of its children:
    (user, system)."""
    times = psutil.Process(pid).cpu_times()
    return float(times.user), float(times.system)


def children_seconds(pid: int) -> float:
    """CPU seconds so far (user + system) of the live processes below ``pid``."""
    total = 0.0
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            times = child.cpu_times()
            total += times.user + times.system
    return total


def round_order(round_: int, systems: Sequence[str] = SYSTEMS) -> list[str]:
    """Which system goes first alternates by round, so a drift weighs on both alike."""
    return list(systems) if round_ % 2 == 0 else list(reversed(systems))


def ratios_by_round(samples: Sequence[CpuSample]) -> list[float]:
    """Per round that measured both: the gateway's API CPU per token over vLLM's server's."""
    by_round: dict[int, dict[str, CpuSample]] = {}
    for sample in samples:
        by_round.setdefault(sample.round, {})[sample.system] = sample
    return [
        pair[GATEWAY].api_us_per_token / pair[VLLM].api_us_per_token
        for _, pair in sorted(by_round.items())
        if GATEWAY in pair and VLLM in pair
    ]


def spread(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summary(samples: Sequence[CpuSample]) -> dict[str, Any]:
    """Per system, the median and range over rounds of each figure; the ratio's, and
    whether it meets the target (<= 1.0x) in every round, in none, or only in some."""
    systems: dict[str, Any] = {}
    for name in SYSTEMS:
        mine = [s for s in samples if s.system == name]
        systems[name] = {
            "api_us_per_token": spread([s.api_us_per_token for s in mine]),
            "api_system_us_per_token": spread([s.api_system_us_per_token for s in mine]),
            "engine_us_per_token": spread([s.engine_us_per_token for s in mine]),
            "tokens_per_second": spread([s.tokens_per_second for s in mine]),
            "errors": sum(s.errors for s in mine),
        }
    ratios = ratios_by_round(samples)
    verdict = (
        "not measured"
        if not ratios
        else "met"
        if max(ratios) <= 1.0
        else "missed"
        if min(ratios) > 1.0
        else "unresolved"
    )
    return {"systems": systems, "ratio": spread(ratios), "ratios": ratios, "verdict": verdict}


def _cell(figure: dict[str, float] | None, digits: int) -> str:
    if figure is None:
        return "-"
    if figure["min"] == figure["max"]:
        return f"{figure['median']:.{digits}f}"
    d = digits
    return f"{figure['median']:.{d}f} ({figure['min']:.{d}f}-{figure['max']:.{d}f})"


def render(result: dict[str, Any], rounds: int) -> str:
    lines = [
        "| system | API-server CPU per output token (us) | of which kernel "
        "| engine processes' CPU per token (us) | output tok/s | errors |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, row in result["systems"].items():
        lines.append(
            f"| {name} | {_cell(row['api_us_per_token'], 1)} "
            f"| {_cell(row['api_system_us_per_token'], 1)} "
            f"| {_cell(row['engine_us_per_token'], 1)} | {_cell(row['tokens_per_second'], 1)} "
            f"| {row['errors']} |"
        )
    lines.append(
        f"\nGateway / vLLM's server, API-server CPU per output token: "
        f"{_cell(result['ratio'], 3)}x, median (range) of {rounds} round(s); "
        f"target <= 1.0x: {result['verdict']}."
    )
    return "\n".join(lines)


async def measure(
    system: System,
    adapters: Sequence[BenchAdapter],
    config: BenchConfig,
    concurrency: int,
    round_: int,
    log_dir: Path,
) -> CpuSample:
    """Start ``system``, warm it up, run (a)'s closed loop at ``concurrency``, stop it."""
    try:
        await system.start(adapters, log_dir / f"{system.name}-round{round_ + 1}.log")
        await warm_up(system, adapters)
        pid = system.pid
        if pid is None:
            raise RuntimeError(f"{system.name} has no process")
        requests = closed_plan(config.mix(), config.waves * concurrency)
        user, kernel = api_server_times(pid)
        engine = children_seconds(pid)
        records, wall = await run_closed_loop(
            system.base_url, system.name, saturation_point(concurrency), requests,
            lambda p: system.call_for(p, adapters), concurrency=concurrency,
            timeout_seconds=config.timeout_seconds,
        )  # fmt: skip
        user_after, kernel_after = api_server_times(pid)
        engine_after = children_seconds(pid)
        return CpuSample(
            system.name, round_, user_after - user, kernel_after - kernel, engine_after - engine,
            sum(r.output_tokens for r in records if r.ok), len(records),
            sum(1 for r in records if not r.ok), wall,
        )  # fmt: skip
    finally:
        await asyncio.to_thread(system.stop)


async def run(
    config: BenchConfig, settings: Settings, concurrency: int, out_dir: Path
) -> list[CpuSample]:
    engine: EngineConfig = scenario_engine(config, settings)
    adapters = await asyncio.to_thread(
        ensure_bench_adapters, Path(settings.model), config.adapter_cache, config.adapters
    )
    work_dir = out_dir / "tmp"
    work_dir.mkdir(parents=True, exist_ok=True)
    samples = []
    for round_ in range(config.rounds):
        for name in round_order(round_):
            system = build_system(name, engine, config.adapter_cache, work_dir, config)
            sample = await measure(system, adapters, config, concurrency, round_, out_dir)
            print(
                f"round {round_ + 1} {name}: {sample.api_us_per_token:.1f} us of API-server CPU "
                f"per output token ({sample.output_tokens} tokens, {sample.errors} errors)",
                flush=True,
            )
            samples.append(sample)
    return samples


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="make bench-quick's sizes of (a)")
    parser.add_argument(
        "--concurrency", type=int, help="of the closed loop (default: (a)'s highest)"
    )
    parser.add_argument("--waves", type=int, default=4, help="requests = waves x concurrency")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    base = BenchConfig.quick() if args.quick else BenchConfig()
    config = BenchConfig(
        **{**asdict(base), "systems": SYSTEMS, "rounds": args.rounds, "waves": args.waves}
    )
    concurrency = args.concurrency or max(config.concurrencies)
    started = datetime.now(timezone.utc)
    out_dir = args.out / f"api-cpu-{started.strftime('%Y%m%dT%H%M%SZ')}"
    out_dir.mkdir(parents=True, exist_ok=True)
    samples = asyncio.run(run(config, Settings(), concurrency, out_dir))
    result = summary(samples)
    text = render(result, config.rounds)
    report = {
        "time": started.isoformat(),
        "command": " ".join(["python -m bench.api_cpu", *(argv or sys.argv[1:])]),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_1m": os.getloadavg()[0],
        },
        "workload": f"scenario (a): {config.adapters} adapters, Zipf {config.zipf:g}, "
        f"{config.base_share:.0%} base-model requests, {config.output_tokens} output tokens, "
        f"closed loop at concurrency {concurrency}, {config.waves * concurrency} requests",
        **result,
        "samples": [asdict(s) for s in samples],
    }
    (out_dir / "summary.json").write_text(json.dumps(report, indent=1) + "\n")
    (out_dir / "summary.md").write_text(text + "\n")
    print(text)
    print(f"results: {out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
