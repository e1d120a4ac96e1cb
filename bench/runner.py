"""One benchmark run: adapters, then interleaved rounds of every system, then the
many-adapters phase on the gateway, then the report.

Each system starts once per round and runs every scenario against one engine,
since an engine start costs far more than a point. The systems take turns in
the same order every round (A B C A B C ...), so drift over the run (other
load on the machine, thermal state) weighs on all of them alike, and every
comparison pairs samples of the same round.
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
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from app.settings import Settings
from bench.client import run_workload
from bench.config import (
    GATEWAY,
    GATEWAY_FCFS,
    VLLM,
    VLLM_SHIPPED,
    BenchConfig,
    many_adapters_point,
)
from bench.prompts import SizedPrompts
from bench.random_adapters import BenchAdapter, ensure_bench_adapters
from bench.report import render_markdown, summary_json, write_requests
from bench.scenarios import (
    Prompts,
    cliff,
    curve,
    noisy_neighbour,
    registered_adapters,
    saturation,
)
from bench.stats import REQUESTS_PS, Sample, interleaved
from bench.status import StatusLine
from bench.systems import EngineConfig, GatewaySystem, System, VLLMServer
from bench.targets import evaluate
from bench.workload import PlannedRequest

WARMUP_TOKENS = 2
RANK_OF_MANY = (8,)


def build_system(
    name: str, engine: EngineConfig, adapter_root: Path, work_dir: Path, config: BenchConfig
) -> System:
    if name in (GATEWAY, GATEWAY_FCFS):
        scheduler = "fcfs" if name == GATEWAY_FCFS else "fair"
        return GatewaySystem(
            engine, adapter_root, work_dir, name=name, scheduler=scheduler,
            extra=dict(config.gateway_settings),
        )  # fmt: skip
    if name in (VLLM, VLLM_SHIPPED):
        return VLLMServer(engine, name=name, isolation_fix=name == VLLM)
    raise ValueError(f"unknown system {name}")


def warmup_plan(adapters: int, group: int, cached: int) -> list[list[PlannedRequest]]:
    """Warm-up before measuring: a base-model request, then the last ``cached``
    (max_cpu_loras) adapters once each, in order, ``group`` (max_loras) at a time.

    First-call costs then land in no system's figures, and every engine starts
    measuring with the same adapters cached: vLLM's server loads every
    ``--lora-modules`` adapter at start-up (its host cache keeps the last
    ``cached``) while our gateway loads on first use; after this pass all hold
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
    cached = min(settings.max_cpu_loras, len(adapters))
    for batch in warmup_plan(len(adapters), settings.max_loras, cached):
        records, _ = await run_workload(
            system.base_url,
            system.name,
            "warmup",
            batch,
            lambda p: system.call_for(p, adapters),
            drain_seconds=300.0,
        )
        if failed := [r.error for r in records if not r.ok]:
            raise RuntimeError(f"{system.name} failed a warm-up request: {failed[0]}")


def curve_rates(config: BenchConfig, samples: Sequence[Sample]) -> dict[float, float]:
    """The open-loop rates (fraction -> req/s): shares of the completed req/s of the
    first saturation sample at the highest concurrency."""
    top = max(config.concurrencies)
    first = next(s for s in samples if s.point.endswith(f"concurrency {top}"))
    saturated = REQUESTS_PS.of(first)
    if not saturated:
        raise RuntimeError(f"{first.system} completed nothing at concurrency {top}")
    return {fraction: fraction * saturated for fraction in config.curve_fractions}


def planned_requests(config: BenchConfig) -> int:
    """Requests the status line counts (tenant A's flood is open-ended, not counted)."""
    per_visit = config.waves * sum(config.concurrencies)
    per_visit += config.curve_requests * len(config.curve_fractions) + 2 * config.victim_requests
    total = per_visit * config.rounds * len(config.systems)
    if config.cliff_multiples:
        points = len(config.cliff_points(config.max_loras))
        cliff = config.waves * config.cliff_concurrency + config.cliff_requests * points
        total += cliff * config.rounds * len(set(config.systems) - {VLLM_SHIPPED})
    many = 2 * config.rounds * config.registered_requests if config.registered else 0
    return total + many


async def _visit(
    system: System,
    round_: int,
    adapters: Sequence[BenchAdapter],
    config: BenchConfig,
    samples: list[Sample],
    out_dir: Path,
    status: StatusLine,
    cliff_rates: dict[int, float],
    prompts: Prompts,
) -> float:
    """Start ``system``, run scenarios a, b and d, stop it; the start-up seconds.
    ``cliff_rates``: d's rate per round, set by the round's first system."""

    label = f"round {round_ + 1}"
    status.set(system.name, f"{label}: starting")
    try:
        startup = await system.start(
            adapters, out_dir / "logs" / f"{system.name}-round{round_ + 1}.log"
        )
        status.note(f"{system.name} ready in {startup:.0f}s ({label})")
        status.set(system.name, f"{label}: warm-up")
        await warm_up(system, adapters)
        status.set(system.name, f"{label}: a, saturation")
        samples += await saturation(system, adapters, config, round_, status.count)
        if config.curve_fractions:
            rates = curve_rates(config, samples)
            status.set(system.name, f"{label}: a, open loop")
            samples += await curve(system, adapters, config, rates, round_, status.count)
        status.set(system.name, f"{label}: b, noisy neighbour")
        samples += await noisy_neighbour(system, adapters, config, round_, status.count)
        if config.cliff_multiples and system.name != VLLM_SHIPPED:  # vLLM's own ops: hours
            status.set(system.name, f"{label}: d, cold-start cliff")
            measured, cliff_rates[round_] = await cliff(
                system, adapters, config, cliff_rates.get(round_), round_, status.count, prompts
            )
            samples += measured
        for sample in samples:
            if sample.system == system.name and sample.round == round_:
                status.note(
                    f"{system.name} {label} {sample.point}: "
                    f"{len(sample.records) - sample.errors}/{len(sample.records)} ok "
                    f"in {sample.wall_seconds:.1f}s"
                    + (f" (first error: {e})" if (e := _first_error(sample)) else "")
                )
        return startup
    finally:
        status.set(system.name, f"{label}: stopping")
        await asyncio.to_thread(system.stop)


def _first_error(sample: Sample) -> str | None:
    return next((r.error for r in sample.records if r.error), None)


async def registered_phase(
    config: BenchConfig,
    engine: EngineConfig,
    model: Path,
    work_dir: Path,
    out_dir: Path,
    status: StatusLine,
) -> list[Sample]:
    status.set(GATEWAY, f"writing {config.registered} rank-8 adapters")
    adapters = await asyncio.to_thread(
        ensure_bench_adapters, model, config.registered_cache, config.registered, RANK_OF_MANY
    )
    slots = config.registered_slots
    settings = engine.settings
    engine = EngineConfig(
        settings.model_copy(
            update={"max_loras": slots, "max_cpu_loras": max(settings.max_cpu_loras, 2 * slots)}
        )
    )
    system = GatewaySystem(
        engine,
        config.registered_cache,
        work_dir,
        tenants=config.registered_tenants,
        extra=dict(config.gateway_settings),
    )
    status.set(GATEWAY, f"c: starting, registering {config.registered} adapters")
    try:
        await system.start(adapters, out_dir / "logs" / f"gateway-{config.registered}.log")
        await warm_up(system, adapters[:1])
        status.set(GATEWAY, f"c: 1 against {config.registered} adapters")
        return await registered_adapters(
            system,
            adapters,
            config,
            config.rounds,
            status.count,
        )
    finally:
        await asyncio.to_thread(system.stop)


def _context(
    config: BenchConfig, engine: EngineConfig, command: str, started: datetime, status: StatusLine,
    order: list[str], startups: dict[str, list[float]],
) -> dict[str, Any]:  # fmt: skip
    s = engine.settings
    return {
        "command": command,
        "started": started.isoformat(timespec="seconds"),
        "wall_seconds": time.perf_counter() - status.started,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}",
        "engine": f"{s.model} dtype={s.dtype} max_model_len={s.max_model_len} "
        f"max_num_seqs={s.max_num_seqs} max_loras={s.max_loras} max_cpu_loras={s.max_cpu_loras} "
        f"max_lora_rank={s.max_lora_rank} kv_cache_gib={s.kv_cache_gib} "
        f"kv_block_size={s.kv_block_size or 'default'} "
        f"enforce_eager={s.enforce_eager} seed={s.seed}",
        "workload": f"{config.adapters} adapters (ranks 8 and 16, attention projections), Zipf "
        f"{config.zipf:g}, {config.base_share:.0%} base-model requests, {config.output_tokens} "
        f"output tokens (greedy, ignore_eos, streamed); closed loops of {config.waves} x "
        f"concurrency requests at concurrency {', '.join(map(str, config.concurrencies))}",
        "systems": list(config.systems),
        "rounds": config.rounds,
        "order": order,
        "startup_seconds": startups,
        "seed": config.seed,
        "draws": config.draws,
        "flood_streams": config.flood_streams,
        "registered_max_loras": config.registered_slots,
        "cliff": f"{', '.join(config.cliff_popularities)} popularity over "
        f"{', '.join(f'{m}x' for m in config.cliff_multiples)} the slots, "
        f"{config.cliff_prompt_tokens}-token prompts, {config.cliff_output_tokens} output tokens, "
        f"{config.cliff_requests} requests per point, open loop at {config.cliff_load:.0%} of "
        f"the saturation the round's first system measured at concurrency "
        f"{config.cliff_concurrency} over as many adapters as slots",
        "gateway_settings": [f"{name}={value}" for name, value in config.gateway_settings],
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
    }


def scenario_engine(config: BenchConfig, settings: Settings) -> EngineConfig:
    """The engine of scenarios a, b and d: ``config.max_loras`` slots, a host tier that holds
    at least as many."""
    update = {
        "max_loras": config.max_loras,
        "max_cpu_loras": max(settings.max_cpu_loras, config.max_loras),
    }
    return EngineConfig(settings.model_copy(update=update))


async def run_bench(config: BenchConfig, settings: Settings, command: str) -> Path:
    """Run the benchmark; return the results directory."""
    started_at = datetime.now(timezone.utc)
    out_dir = config.out / started_at.strftime("%Y%m%dT%H%M%SZ")
    work_dir = out_dir / "tmp"
    work_dir.mkdir(parents=True, exist_ok=True)
    engine = scenario_engine(config, settings)
    status = StatusLine(planned_requests(config))
    status.set("-", "writing adapters")
    adapters = await asyncio.to_thread(
        ensure_bench_adapters, Path(settings.model), config.adapter_cache, config.adapters
    )
    ticker = asyncio.create_task(status.run(0.5))
    prompts: Prompts = (
        SizedPrompts(Path(settings.model), config.cliff_prompt_tokens)
        if config.cliff_multiples
        else str  # never asked: d is skipped
    )
    samples: list[Sample] = []
    startups: dict[str, list[float]] = {name: [] for name in config.systems}
    order: list[str] = []
    cliff_rates: dict[int, float] = {}
    try:
        for round_, name in interleaved(config.systems, config.rounds):
            system = build_system(name, engine, config.adapter_cache, work_dir, config)
            startups[name].append(
                await _visit(
                    system,
                    round_,
                    adapters,
                    config,
                    samples,
                    out_dir,
                    status,
                    cliff_rates,
                    prompts,
                )
            )
            order.append(name)
        if config.registered:
            samples += await registered_phase(
                config, engine, Path(settings.model), work_dir, out_dir, status
            )
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        status.finish()

    context = _context(config, engine, command, started_at, status, order, startups)
    if config.curve_fractions and samples:
        context["curve_rates"] = curve_rates(config, samples)
    if cliff_rates:
        context["cliff_rates"] = cliff_rates
    registered = many_adapters_point(config.registered) if config.registered else None
    targets = evaluate(
        samples, config.concurrencies, config.registered, config.seed, config.draws,
        cliff=(config.cliff_popularities, engine.settings.max_loras) if cliff_rates else None,
    )  # fmt: skip
    text, ratios = render_markdown(samples, targets, context, registered)
    write_requests(out_dir / "requests.jsonl", samples)
    (out_dir / "summary.md").write_text(text)
    (out_dir / "summary.json").write_text(
        json.dumps(summary_json(samples, targets, context, ratios), indent=2) + "\n"
    )
    with contextlib.suppress(OSError):  # the throwaway stores; logs stay
        for leftover in work_dir.rglob("*"):
            if leftover.is_file():
                leftover.unlink()
        for directory in [*sorted(work_dir.rglob("*"), reverse=True), work_dir]:
            directory.rmdir()
    print(text)
    print(f"results: {out_dir}", file=sys.stdout)
    return out_dir
