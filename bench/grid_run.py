"""``python -m bench.grid_run`` (``make bench-grid``, ``make bench-grid-quick``): scenario (e),
the gateway against vLLM's server with the same ops over the grid of :mod:`bench.grid`.

In every round vLLM's server runs its one-adapter-per-slot points first: they fix the round's
objectives and the open loop's rate, which the gateway then runs with. Its other points run
before the gateway's in even rounds and after them in odd ones (:func:`round_plan`), so that a
machine that drifts within a round weighs on both systems alike. A system runs its points of a
visit on one engine, started for the visit; the adapters of both pools are registered on both
(the gateway: one tenant per adapter, as in scenario a).
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
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from app.settings import Settings
from bench import scenarios
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
# In a run's directory: its grid's command-line arguments, and every visit's samples as the
# visit ends, so that a run cut short, or one round at a time, can be resumed (``--resume``).
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


def round_plan(points: Sequence[GridPoint], round_: int) -> list[tuple[str, list[GridPoint]]]:
    """Which system runs which points in round ``round_``, visit by visit: vLLM's server's
    references (its points at one adapter per slot) always first, its other points before
    the gateway's in even rounds and after them in odd ones."""
    points = list(points)
    references = [p for p in points if p == p.reference]
    others = [p for p in points if p != p.reference]
    if round_ % 2 == 0 or not others:
        return [(VLLM, points), (GATEWAY, points)]
    return [(VLLM, references), (GATEWAY, points), (VLLM, others)]


async def visit(
    system: System,
    points: Sequence[GridPoint],
    config: GridConfig,
    round_: int,
    this_round: Round,
    adapters: Sequence[BenchAdapter],
    prompts: SizedPrompts,
    log: Path,
    status: StatusLine,
) -> list[Sample]:
    """Start ``system``, run ``points``, stop it."""
    label = f"round {round_ + 1}"
    status.set(system.name, f"{label}: starting")
    samples: list[Sample] = []
    every_point = config.points()
    try:
        await system.start(adapters, log)
        status.set(system.name, f"{label}: warm-up")
        await warm_up(system, adapters)
        serving: Objectives | None = None
        for point in points:
            number = every_point.index(point)  # both systems send a point the same prompts
            name = point.name(this_round.slots)
            objectives = this_round.objectives.get(point.group)
            if isinstance(system, GatewaySystem):
                if objectives is None:
                    raise RuntimeError(f"no objectives from {VLLM} for {name}")
                if objectives != serving:
                    await system.set_objectives(*objectives.milliseconds())
                    serving = objectives
            status.set(system.name, f"{label}: {name}")
            requests = [
                # A short label, unique to the point and request: no shared cached prefix.
                dataclasses.replace(r, prompt=prompts(f"{number}.{r.index}"))
                for r in config.requests(point, this_round.rate(point))
            ]
            sample = await run_point(system, point, requests, adapters, round_, name, status)
            if system.name == VLLM:
                this_round.learn(point, sample)
                objectives = this_round.objectives[point.group]
            assert objectives is not None
            counters = {**sample.counters, SLO_TTFT: objectives.ttft, SLO_TPOT: objectives.tpot}
            samples.append(dataclasses.replace(sample, counters=counters))
            status.note(
                f"{system.name} {label} {name}: {len(sample.records) - sample.errors}/"
                f"{len(sample.records)} ok in {sample.wall_seconds:.1f}s"
            )
        return samples
    finally:
        status.set(system.name, f"{label}: stopping")
        await asyncio.to_thread(system.stop)


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
    engine = EngineConfig(
        settings.model_copy(
            update={
                "max_loras": config.max_loras,
                "max_cpu_loras": max(settings.max_cpu_loras, config.max_loras),
            }
        )
    )
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
            this_round = Round(config, slots)
            for visit_number, (name, points) in enumerate(round_plan(config.points(), round_)):
                system: System = (
                    VLLMServer(engine)
                    if name == VLLM
                    else GatewaySystem(
                        engine,
                        config.adapter_cache / "grid",
                        work_dir,
                        extra=dict(config.gateway_settings),
                    )
                )
                log = out_dir / "logs" / f"{name}-round{round_ + 1}-{visit_number + 1}.log"
                visited = await visit(
                    system, points, config, round_, this_round, adapters, prompts, log, status
                )
                append_samples(saved, visited)
                samples += visited
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
        default="",
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
    pairs = [item.partition("=") for item in args.gateway_settings.split(",") if item]
    if any(not sep for _, sep, _ in pairs):
        raise ValueError("--gateway-settings takes NAME=VALUE pairs")
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
    if pairs:
        overrides["gateway_settings"] = tuple((name, value) for name, _, value in pairs)
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
