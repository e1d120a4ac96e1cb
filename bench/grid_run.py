"""``python -m bench.grid_run`` (``make bench-grid``, ``make bench-grid-quick``): scenario (e),
the gateway against vLLM's server with the same ops over the grid of :mod:`bench.grid`.

Both systems are started for a round and run each point back to back, one at a time while the
other idles (an idle vLLM engine waits on a socket, not a spin), so that a machine that drifts
within a round, as a shared one does over minutes, weighs on both alike (:func:`round_plan`).
vLLM's server runs a one-adapter-per-slot point first: it fixes the objectives of the point's
group and the open loop's rate, which the gateway then runs with; at the other points the
system that goes first alternates. Each system runs its points on one engine, started for the
round; the adapters of both pools are registered on both (the gateway: one tenant per adapter,
as in scenario a).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from app.settings import Settings
from bench import scenarios
from bench.__main__ import settings_pairs
from bench.client import RequestRecord, run_closed_loop, run_workload
from bench.config import GATEWAY, VLLM
from bench.grid import TARGET_MODULES, GridConfig, GridPoint, Load, Objectives
from bench.grid_report import evaluate_grid, render_grid
from bench.prompts import SizedPrompts
from bench.random_adapters import BenchAdapter, ensure_bench_adapters
from bench.report import write_requests
from bench.runner import warm_up
from bench.stats import REQUESTS_PS, SLO_TPOT, SLO_TTFT, TPOT_P50, TTFT_P50, Sample
from bench.status import StatusLine
from bench.systems import EngineConfig, GatewaySystem, System, VLLMServer
from bench.workload import PlannedRequest

SYSTEMS = (VLLM, GATEWAY)
TIMEOUT_SECONDS = 1800.0  # longest a closed loop may run
# In a run's directory: its grid's command-line arguments, and every sample as its point ends,
# so that a run cut short, or one round at a time, can be resumed (``--resume``).
ARGUMENTS_FILE = "arguments.json"
SAMPLES_FILE = "samples.jsonl"


def adapter_pools(config: GridConfig, model: Path) -> list[BenchAdapter]:
    """Both pools, attention-only then all projections, :meth:`GridConfig.pool_size` each,
    under ``config.adapter_cache / "grid"`` (the gateway's adapter root)."""
    root = config.adapter_cache / "grid"
    pools: list[BenchAdapter] = []
    for targets, modules in TARGET_MODULES.items():
        pools += ensure_bench_adapters(
            model, root / targets, config.pool_size(), target_modules=modules,
            prefix=f"grid-{targets}",
        )  # fmt: skip
    return pools


class Round:
    """One round's figures that the gateway takes from vLLM's server: each group's objectives
    and each adapter target's saturation rate."""

    def __init__(self, config: GridConfig, slots: int) -> None:
        self.config = config
        self.slots = slots
        self.objectives: dict[tuple[str, Load], Objectives] = {}
        self.saturation: dict[str, float] = {}  # targets -> req/s at 1x, highest concurrency

    def learn(self, point: GridPoint, sample: Sample) -> None:
        """Take the objectives (and the saturation) from the reference's 1x sample."""
        if point != point.reference:
            return
        ttft, tpot = TTFT_P50.of(sample), TPOT_P50.of(sample)
        if ttft is None or tpot is None:
            raise RuntimeError(f"{sample.system} completed nothing at {sample.point}")
        self.objectives[point.group] = Objectives.from_reference(ttft, tpot)
        if point.load == self.config.saturation_load:
            self.saturation[point.targets] = REQUESTS_PS.of(sample) or 0.0

    def rate(self, point: GridPoint) -> float | None:
        if point.load.closed:
            return None
        return point.load.share * self.saturation[point.targets]


async def run_point(
    system: System,
    point: GridPoint,
    requests: Sequence[PlannedRequest],
    adapters: Sequence[BenchAdapter],
    round_: int,
    name: str,
    status: StatusLine,
) -> Sample:
    async def measure() -> tuple[list[RequestRecord], float]:
        if point.load.closed:
            return await run_closed_loop(
                system.base_url, system.name, name, requests,
                lambda p: system.call_for(p, adapters), concurrency=point.load.concurrency,
                timeout_seconds=TIMEOUT_SECONDS, on_finished=status.count,
            )  # fmt: skip
        duration = requests[-1].at if requests else 0.0
        return await run_workload(
            system.base_url, system.name, name, requests,
            lambda p: system.call_for(p, adapters),
            drain_seconds=max(scenarios.MIN_DRAIN_SECONDS, duration), on_finished=status.count,
        )  # fmt: skip

    # Through the module, where an in-situ profile (bench.insitu) records every point.
    return await scenarios.sample_of(system, name, round_, measure)


def round_plan(points: Sequence[GridPoint], round_: int) -> list[tuple[GridPoint, tuple[str, ...]]]:
    """Each point of round ``round_`` with the order its systems run it in, back to back:
    vLLM's server first at a reference (its sample fixes the gateway's objectives), and at
    the others first at every other one, the other way round in the next round."""
    plan: list[tuple[GridPoint, tuple[str, ...]]] = []
    others = 0
    for point in points:
        if point == point.reference:
            plan.append((point, (VLLM, GATEWAY)))
            continue
        plan.append((point, (VLLM, GATEWAY) if (others + round_) % 2 == 0 else (GATEWAY, VLLM)))
        others += 1
    return plan


async def run_round(
    systems: Mapping[str, System],
    config: GridConfig,
    round_: int,
    adapters: Sequence[BenchAdapter],
    prompts: SizedPrompts,
    logs: Path,
    saved: Path,
    status: StatusLine,
) -> list[Sample]:
    """Start ``systems``, run round ``round_``'s points on them (:func:`round_plan`), each
    sample appended to ``saved`` as it ends, and stop them."""
    label = f"round {round_ + 1}"
    this_round = Round(config, config.max_loras)
    every_point = config.points()
    serving: Objectives | None = None
    samples: list[Sample] = []
    try:
        for system_name, system in systems.items():
            status.set(system_name, f"{label}: starting")
            await system.start(adapters, logs / f"{system_name}-round{round_ + 1}.log")
            status.set(system_name, f"{label}: warm-up")
            await warm_up(system, adapters)
        for point, order in round_plan(every_point, round_):
            number = every_point.index(point)  # both systems send a point the same prompts
            name = point.name(this_round.slots)
            for system_name in order:
                system = systems[system_name]
                objectives = this_round.objectives.get(point.group)
                if isinstance(system, GatewaySystem):
                    if objectives is None:
                        raise RuntimeError(f"no objectives from {VLLM} for {name}")
                    if objectives != serving:
                        await system.set_objectives(*objectives.milliseconds())
                        serving = objectives
                status.set(system_name, f"{label}: {name}")
                requests = [
                    # A short label, unique to the point and request: no shared cached prefix.
                    dataclasses.replace(r, prompt=prompts(f"{number}.{r.index}"))
                    for r in config.requests(point, this_round.rate(point))
                ]
                sample = await run_point(system, point, requests, adapters, round_, name, status)
                if system_name == VLLM:
                    this_round.learn(point, sample)
                    objectives = this_round.objectives[point.group]
                assert objectives is not None
                counters = {**sample.counters, SLO_TTFT: objectives.ttft, SLO_TPOT: objectives.tpot}
                sample = dataclasses.replace(sample, counters=counters)
                append_samples(saved, [sample])
                samples.append(sample)
                status.note(
                    f"{system_name} {label} {name}: {len(sample.records) - sample.errors}/"
                    f"{len(sample.records)} ok in {sample.wall_seconds:.1f}s"
                )
        return samples
    finally:
        for system_name, system in systems.items():
            status.set(system_name, f"{label}: stopping")
            await asyncio.to_thread(system.stop)


def grid_engine(config: GridConfig, settings: Settings) -> EngineConfig:
    """The engine both systems run the grid on: ``config.max_loras`` slots, a host tier that
    holds at least as many."""
    update = {
        "max_loras": config.max_loras,
        "max_cpu_loras": max(settings.max_cpu_loras, config.max_loras),
    }
    return EngineConfig(settings.model_copy(update=update))


def planned_requests(config: GridConfig, rounds: int) -> int:
    per_round = sum(
        config.closed_requests(p.load) if p.load.closed else config.open_requests
        for p in config.points()
    )
    return per_round * rounds * len(SYSTEMS)


def append_samples(path: Path, samples: Sequence[Sample]) -> None:
    with path.open("a") as out:
        for sample in samples:
            line = {**dataclasses.asdict(sample), "counters": dict(sample.counters)}
            out.write(json.dumps(line) + "\n")


def whole_rounds(path: Path, config: GridConfig, slots: int) -> list[Sample]:
    """The samples saved at ``path`` of the rounds that ran every point on both systems: a
    round cut short is run again whole, as its references fix its objectives."""
    if not path.exists():
        return []
    samples = []
    for line in path.read_text().splitlines():
        saved = json.loads(line)
        records = tuple(RequestRecord(**r) for r in saved.pop("records"))
        samples.append(Sample(records=records, **saved))
    wanted = {(system, p.name(slots)) for system in SYSTEMS for p in config.points()}
    rounds = sorted({s.round for s in samples})
    whole = [r for r in rounds if {(s.system, s.point) for s in samples if s.round == r} == wanted]
    kept = whole[: next((i for i, r in enumerate(whole) if r != i), len(whole))]
    return [s for s in samples if s.round in kept]


async def run_grid(
    config: GridConfig,
    settings: Settings,
    arguments: Sequence[str],
    resume: Path | None = None,
) -> Path:
    """Run the grid's rounds (of the command line's ``arguments``) into a new directory, or,
    with ``resume``, the rounds that directory's run has not finished, and report on all."""
    started = datetime.now(timezone.utc)
    out_dir = resume or config.out / f"grid-{started.strftime('%Y%m%dT%H%M%SZ')}"
    work_dir = out_dir / "tmp"
    work_dir.mkdir(parents=True, exist_ok=True)
    if resume is None:
        (out_dir / ARGUMENTS_FILE).write_text(json.dumps(list(arguments)) + "\n")
    command = " ".join(["python -m bench.grid_run", *arguments])
    engine = grid_engine(config, settings)
    slots = engine.settings.max_loras
    saved = out_dir / SAMPLES_FILE
    samples = whole_rounds(saved, config, slots)
    saved.unlink(missing_ok=True)
    append_samples(saved, samples)
    first_round = len({s.round for s in samples})
    status = StatusLine(planned_requests(config, config.rounds - first_round))
    status.set("-", "writing adapters")
    model = Path(settings.model)
    adapters = await asyncio.to_thread(adapter_pools, config, model)
    prompts = SizedPrompts(model, config.prompt_tokens)
    ticker = asyncio.create_task(status.run(0.5))
    try:
        for round_ in range(first_round, config.rounds):
            systems: dict[str, System] = {
                VLLM: VLLMServer(engine),
                GATEWAY: GatewaySystem(
                    engine, config.adapter_cache / "grid", work_dir,
                    extra=dict(config.gateway_settings),
                ),
            }  # fmt: skip
            logs = out_dir / "logs"
            samples += await run_round(
                systems, config, round_, adapters, prompts, logs, saved, status
            )
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        status.finish()
    targets = evaluate_grid(samples, config.points(), slots, config.seed, config.draws)
    context = {
        "command": command,
        "started": started.isoformat(timespec="seconds"),
        "wall_seconds": round(datetime.now(timezone.utc).timestamp() - started.timestamp()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}",
        "engine": f"{settings.model} max_num_seqs={settings.max_num_seqs} max_loras={slots} "
        f"max_cpu_loras={engine.settings.max_cpu_loras} "
        f"lora_slot_quantum_tokens={settings.lora_slot_quantum_tokens}",
        "rounds": config.rounds,
        "resumed": f"{first_round} rounds run before, this one's time" if first_round else "no",
        "config": {
            k: str(v) if isinstance(v, Path) else v
            for k, v in dataclasses.asdict(config).items()
            if k != "only"
        },
        "points": [p.name(slots) for p in config.points()],
    }
    text = render_grid(samples, config.points(), slots, targets, context, config.seed, config.draws)
    write_requests(out_dir / "requests.jsonl", samples)
    (out_dir / "summary.md").write_text(text)
    (out_dir / "summary.json").write_text(
        json.dumps(
            {"context": context, "targets": [dataclasses.asdict(t) for t in targets]}, indent=2
        )
        + "\n"
    )
    with contextlib.suppress(OSError):
        for leftover in sorted(work_dir.rglob("*"), reverse=True):
            leftover.unlink() if leftover.is_file() else leftover.rmdir()
        work_dir.rmdir()
    print(text)
    print(f"results: {out_dir}")
    return out_dir


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.grid_run",
        description="Scenario (e): the slot turns judged on a grid, gateway against vLLM's "
        "server with the same ops (engine settings from the LORA_GATEWAY_* environment).",
    )
    parser.add_argument(
        "--quick", action="store_true", help="one round of two points and their references"
    )
    parser.add_argument("--rounds", type=int, help="rounds (default 3; quick: 1)")
    parser.add_argument(
        "--waves", type=int, help="a closed loop sends waves x concurrency (at least 96)"
    )
    parser.add_argument("--open-requests", type=int, help="requests per open-loop point")
    parser.add_argument(
        "--gateway-settings",
        type=settings_pairs,
        default=(),
        help="more LORA_GATEWAY_* settings for the gateway, NAME=VALUE,...",
    )
    parser.add_argument("--out", type=Path, help="results parent directory")
    parser.add_argument(
        "--resume",
        type=Path,
        metavar="DIR",
        help="a run's directory: run its rounds not yet finished (up to --rounds, else its "
        "own), with its own grid arguments, and report on them all",
    )
    return parser


def config_from(args: argparse.Namespace) -> GridConfig:
    config = GridConfig.quick() if args.quick else GridConfig()
    overrides: dict[str, Any] = {
        name: value
        for name, value in (
            ("rounds", args.rounds),
            ("waves", args.waves),
            ("open_requests", args.open_requests),
            ("out", args.out),
        )
        if value is not None
    }
    if args.gateway_settings:
        overrides["gateway_settings"] = args.gateway_settings
    return dataclasses.replace(config, **overrides)


def resumed_arguments(arguments: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """The command line a run is resumed with: the run's own grid arguments (saved in its
    directory), with the rounds asked for now."""
    args = parser.parse_args(arguments)
    saved = json.loads((args.resume / ARGUMENTS_FILE).read_text())
    rounds = ["--rounds", str(args.rounds)] if args.rounds is not None else []
    return [*saved, *rounds, "--resume", str(args.resume)]


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    try:
        if parser.parse_args(arguments).resume is not None:
            arguments = resumed_arguments(arguments, parser)
        args = parser.parse_args(arguments)
        config = config_from(args)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    asyncio.run(run_grid(config, Settings(), arguments, args.resume))
    return 0


if __name__ == "__main__":
    sys.exit(main())
