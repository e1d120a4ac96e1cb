"""One benchmark run: adapters, then rounds of gateway and vLLM server, then the report.

Each system starts once per round and runs every workload point (the main
workload, then the adapter-count sweep) against one engine, since an engine
start costs far more than a point. The systems alternate round by round on
the same machine, so drift over the run (other load, thermal state) hits
both alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from app.settings import Settings
from bench.client import RequestRecord, run_workload
from bench.random_adapters import BenchAdapter, ensure_bench_adapters
from bench.report import (
    MAIN_POINT,
    PointRun,
    aggregate,
    figures_table,
    plot,
    render_markdown,
    summary_json,
    sweep_point_name,
    write_requests,
)
from bench.status import StatusLine
from bench.swap_counters import parse_swap_counters
from bench.systems import EngineConfig, GatewaySystem, System, VLLMServer
from bench.workload import PlannedRequest, WorkloadSpec, plan

WARMUP_TOKENS = 2
# Requests still running this long after the last arrival count as errors.
MIN_DRAIN_SECONDS = 45.0


@dataclass(frozen=True)
class BenchConfig:
    # The default load keeps the small CPU engine below overload, so that both
    # systems answer every request; a GPU takes --rate about a hundred times
    # higher. docs/performance.md gives the measurements behind these numbers.
    rate: float = 0.25
    duration: float = 40.0
    sweep_duration: float = 20.0
    adapters: int = 32
    zipf: float = 1.0
    base_share: float = 0.2
    output_tokens: int = 32
    rounds: int = 2
    sweep: tuple[int, ...] = (1, 8, 32, 128)
    seed: int = 0
    out: Path = Path("bench/results")
    adapter_cache: Path = Path("var/bench/adapters")

    @classmethod
    def quick(cls) -> BenchConfig:
        """Under three minutes with both engine starts: one round, a short load,
        a small sweep."""
        return cls(rate=0.4, duration=12.0, sweep_duration=12.0, adapters=8, rounds=1, sweep=(1, 8))

    def points(self) -> dict[str, WorkloadSpec]:
        main = WorkloadSpec(
            rate=self.rate,
            duration=self.duration,
            adapters=self.adapters,
            zipf=self.zipf,
            base_share=self.base_share,
            output_tokens=self.output_tokens,
            seed=self.seed,
        )
        points = {MAIN_POINT: main}
        for count in self.sweep:
            if count != self.adapters:  # the main point is that sweep point already
                points[sweep_point_name(count)] = replace(
                    main, adapters=count, duration=self.sweep_duration
                )
        return points


def warmup_plan(adapters: int, group: int, cached: int) -> list[list[PlannedRequest]]:
    """Warm-up before measuring: a base-model request, then the last ``cached``
    (max_cpu_loras) adapters once each, in order, ``group`` (max_loras) at a time.

    First-call costs then land in neither system's figures, and both engines
    start measuring with the same adapters cached: vLLM's server loads every
    ``--lora-modules`` adapter at start-up (its host cache keeps the last
    ``cached``) while our gateway loads on first use; after this pass both hold
    exactly those adapters in host memory, and the last group in device slots.
    """
    base = [PlannedRequest(0, 0.0, 0, None, "Say hello.", WARMUP_TOKENS)]
    touches = [
        PlannedRequest(i + 1, 0.0, i, i, "Say hello.", WARMUP_TOKENS)
        for i in range(max(0, adapters - cached), adapters)
    ]
    return [base] + [touches[i : i + group] for i in range(0, len(touches), group)]


async def warm_up(system: System, adapters: Sequence[BenchAdapter]) -> None:
    settings = system.engine.settings
    for batch in warmup_plan(len(adapters), settings.max_loras, settings.max_cpu_loras):
        records, _ = await run_workload(
            system.base_url,
            system.name,
            "warmup",
            batch,
            lambda p: system.call_for(p, adapters),
            drain_seconds=120.0,
        )
        if failed := [r.error for r in records if not r.ok]:
            raise RuntimeError(f"{system.name} failed a warm-up request: {failed[0]}")


async def run_system(
    system: System,
    round_: int,
    adapters: Sequence[BenchAdapter],
    points: dict[str, WorkloadSpec],
    plans: dict[str, list[PlannedRequest]],
    out_dir: Path,
    status: StatusLine,
) -> tuple[list[PointRun], float]:
    """Start ``system``, run every point against it, stop it; the runs and start-up seconds."""
    status.set(system.name, f"round {round_ + 1}: starting")
    try:
        startup = await system.start(
            adapters, out_dir / "logs" / f"{system.name}-round{round_ + 1}.log"
        )
        status.note(f"{system.name} ready in {startup:.0f}s (round {round_ + 1})")
        status.set(system.name, f"round {round_ + 1}: warm-up")
        await warm_up(system, adapters)
        runs: list[PointRun] = []
        for name, spec in points.items():
            status.set(system.name, f"round {round_ + 1}: {name}")
            before = await system.metrics_text()

            def finished(_: object) -> None:
                status.done += 1

            records, wall = await run_workload(
                system.base_url,
                system.name,
                name,
                plans[name],
                lambda p: system.call_for(p, adapters),
                drain_seconds=max(MIN_DRAIN_SECONDS, spec.duration),
                on_finished=finished,
            )
            after = await system.metrics_text()
            residency = (
                parse_swap_counters(after) - parse_swap_counters(before)
                if before is not None and after is not None
                else None
            )
            runs.append(PointRun(system.name, name, round_, spec, records, wall, residency))
            errors = sum(1 for r in records if not r.ok)
            status.note(
                f"{system.name} round {round_ + 1} {name}: "
                f"{len(records) - errors}/{len(records)} ok in {wall:.1f}s"
                + (
                    f" (first error: {first_error})"
                    if (first_error := _first_error(records))
                    else ""
                )
            )
        return runs, startup
    finally:
        status.set(system.name, f"round {round_ + 1}: stopping")
        await asyncio.to_thread(system.stop)


def _first_error(records: Sequence[RequestRecord]) -> str | None:
    return next((r.error for r in records if r.error), None)


async def run_bench(config: BenchConfig, settings: Settings, command: str) -> Path:
    """Run the benchmark; return the results directory."""
    started_at = datetime.now(timezone.utc)
    out_dir = config.out / started_at.strftime("%Y%m%dT%H%M%SZ")
    work_dir = out_dir / "tmp"
    work_dir.mkdir(parents=True, exist_ok=True)
    engine = EngineConfig(settings)
    points = config.points()
    plans = {name: plan(spec) for name, spec in points.items()}
    total = 2 * config.rounds * sum(len(p) for p in plans.values())
    status = StatusLine(total)

    status.set("-", "writing adapters")
    count = max(spec.adapters for spec in points.values())
    adapters = await asyncio.to_thread(
        ensure_bench_adapters, Path(settings.model), config.adapter_cache, count
    )
    ticker = asyncio.create_task(status.run(0.5))
    runs: list[PointRun] = []
    startups: dict[str, list[float]] = {"gateway": [], "vllm": []}
    order: list[str] = []
    try:
        for round_ in range(config.rounds):
            systems: list[System] = [
                GatewaySystem(engine, config.adapter_cache, work_dir),
                VLLMServer(engine),
            ]
            if round_ % 2:  # A B B A ...: a drift over the run weighs on both alike
                systems.reverse()
            for system in systems:
                system_runs, startup = await run_system(
                    system, round_, adapters, points, plans, out_dir, status
                )
                runs += system_runs
                startups[system.name].append(startup)
                order.append(system.name)
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        status.finish()

    s = engine.settings
    context = {
        "command": command,
        "started": started_at.isoformat(timespec="seconds"),
        "wall_seconds": time.perf_counter() - status.started,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}",
        "engine": f"{s.model} dtype={s.dtype} max_model_len={s.max_model_len} "
        f"max_num_seqs={s.max_num_seqs} max_loras={s.max_loras} max_cpu_loras={s.max_cpu_loras} "
        f"max_lora_rank={s.max_lora_rank} kv_cache_gib={s.kv_cache_gib} "
        f"enforce_eager={s.enforce_eager} seed={s.seed}",
        "rounds": config.rounds,
        "order": order,
        "startup_seconds": startups,
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
    }
    results = aggregate(runs)
    write_requests(out_dir / "requests.jsonl", runs)
    plot_name = "bench.png"
    plot(out_dir / plot_name, results, config.sweep)
    (out_dir / "summary.md").write_text(render_markdown(results, config.sweep, context, plot_name))
    (out_dir / "summary.json").write_text(
        json.dumps(summary_json(results, context), indent=2) + "\n"
    )
    with contextlib.suppress(OSError):  # the throwaway stores; logs stay
        for leftover in work_dir.rglob("*"):
            if leftover.is_file():
                leftover.unlink()
        for directory in [*sorted(work_dir.rglob("*"), reverse=True), work_dir]:
            directory.rmdir()

    main = results[MAIN_POINT]
    print("\n".join(figures_table(main)))
    for target in main.targets():
        print(f"{'met   ' if target.met else 'MISSED'} {target.name}: {target.detail}")
    print(f"results: {out_dir}", file=sys.stdout)
    return out_dir
