"""Scenario (f), batches beside interactive traffic (issue #52): ``python -m bench.batches``
(``make bench-batches``).

One gateway on the real engine, (a)'s 32 adapters and tenants, and one more tenant, the batch
tenant, granted them all. Each round, on that gateway:

1. (a)'s closed loop at saturation: its output tok/s (round 1's req/s sets the load's rate);
2. the batch's lines sent online by the batch tenant, a closed loop at saturation;
3. the same lines as a batch alone, through the official ``openai`` client: the file uploaded,
   the batch created and polled until ``completed``, its output and error files read back
   (one record per line; the batch's time runs from the upload to ``completed`` seen);
   ``--alone-only`` runs only 2 and 3 (``batches.alone``, a few minutes); ``--probe-rate``
   sends (a)'s requests cut to one output token at that rate beside the batch alone, and then
   as long with no batch: how long an interactive request arriving at a batch alone waits for
   its first token (the batch's ``batches.alone`` then counts the probes' interruptions);
4. (a)'s interactive open loop at ``load`` of saturation, with the batch (submitted as it
   starts; arrivals stop once it has completed) and without it (for as long as the last
   run with it took), in alternating order from round to round.

The targets (bench/targets.py, ``evaluate_batches``) pair the samples of each round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import openai

from app.settings import Settings
from bench.__main__ import settings_pairs
from bench.batch_workload import BatchSizes, batch_file, batch_records
from bench.client import Call, RequestRecord, run_closed_loop, run_workload
from bench.config import (
    BATCH_ALONE,
    BATCH_BESIDE,
    BATCH_ONLINE,
    BATCH_SATURATION,
    CAPACITY_LEFT,
    GATEWAY,
    INTERACTIVE_WITH,
    INTERACTIVE_WITHOUT,
    BenchConfig,
)
from bench.random_adapters import BenchAdapter, ensure_bench_adapters
from bench.report import BOOTSTRAP, write_requests
from bench.runner import scenario_engine, warm_up
from bench.stats import (
    BATCH_ALONE_TPS,
    OUTPUT_TPS,
    REQUESTS_PS,
    SATURATION_TPS,
    TPOT_P50,
    TTFT_P50,
    TTFT_P99,
    Figure,
    Sample,
    median_of_rounds,
)
from bench.systems import ADMIN_HEADERS, GatewaySystem
from bench.targets import TargetResult, evaluate_batches
from bench.workload import PlannedRequest

BATCH_TENANT = "tenant-batch"
TERMINAL = ("completed", "failed", "expired", "cancelled")
PROBES_BESIDE = "f: one-token interactive probes beside the batch alone"
PROBES_ALONE = "f: the same probes with no batch"
POLL_SECONDS = 0.5
DRAIN_SECONDS = 120.0


@dataclass(frozen=True)
class BatchBenchConfig:
    sizes: BatchSizes = field(default_factory=BatchSizes)
    rounds: int = 3
    draws: int = 2000
    timeout_seconds: float = 1800.0  # longest a batch, or a closed loop, may run
    out: Path = Path("bench/results")
    # More LORA_GATEWAY_* settings for the gateway (name without the prefix -> value).
    gateway_settings: tuple[tuple[str, str], ...] = ()
    # Each round the lines online and the batch alone only: no interactive load.
    alone_only: bool = False
    # One-token interactive probes a second beside the batch alone, and as long without it.
    probe_rate: float = 0.0

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError("at least one round")

    @classmethod
    def quick(cls) -> BatchBenchConfig:
        """One round of a 50-line batch (a few minutes on a 2-core CPU)."""
        return cls(sizes=BatchSizes(lines=50), rounds=1)


@dataclass
class BatchRun:
    """A batch's lines as records, and how long it took from upload to ``completed``."""

    records: list[RequestRecord]
    seconds: float
    status: str


class BatchTenant:
    """The batch tenant on a started gateway: its key, and its batches through the official
    ``openai`` client."""

    def __init__(self, system: GatewaySystem, adapters: Sequence[BenchAdapter]) -> None:
        self.system = system
        self.adapters = adapters
        self.key = ""

    async def provision(self) -> None:
        """Create the tenant (base model allowed), its key, and a grant of every adapter."""
        async with httpx.AsyncClient(
            base_url=f"{self.system.base_url}/admin/v1", headers=ADMIN_HEADERS, timeout=120.0
        ) as admin:

            async def checked(method: str, url: str, body: dict[str, Any]) -> dict[str, Any]:
                response = await admin.request(method, url, json=body)
                if response.status_code >= 300:
                    raise RuntimeError(f"{method} {url}: {response.status_code} {response.text}")
                result: dict[str, Any] = response.json()
                return result

            await checked(
                "POST", "/tenants",
                {"id": BATCH_TENANT, "name": BATCH_TENANT, "allow_base_model": True},
            )  # fmt: skip
            self.key = (await checked("POST", f"/tenants/{BATCH_TENANT}/keys", {"name": "b"}))[
                "key"
            ]
            for adapter in self.adapters:
                await checked(
                    "PUT", f"/tenants/{BATCH_TENANT}/adapters/{adapter.name}",
                    {"adapter": adapter.name},
                )  # fmt: skip
        await asyncio.sleep(2 * self.system.engine.settings.registry_poll_seconds)

    def model_of(self, planned: PlannedRequest) -> str:
        return self.system.call_for(planned, self.adapters).model

    def call_for(self, planned: PlannedRequest) -> Call:
        return Call(self.model_of(planned), self.key)

    async def run(
        self, sizes: BatchSizes, point: str, timeout: float, started: asyncio.Event | None = None
    ) -> BatchRun:
        """Upload the batch's file, create the batch, poll it to its end, read its files back
        and delete them. ``started`` is set once the batch is created."""
        lines = sizes.batch_plan()
        client = openai.AsyncOpenAI(
            base_url=f"{self.system.base_url}/v1", api_key=self.key, max_retries=0, timeout=300
        )
        try:
            began = time.perf_counter()
            uploaded = await client.files.create(
                file=("batch.jsonl", batch_file(lines, self.model_of)), purpose="batch"
            )
            batch = await client.batches.create(
                input_file_id=uploaded.id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
            )
            if started is not None:
                started.set()
            while batch.status not in TERMINAL:
                if time.perf_counter() - began > timeout:
                    await client.batches.cancel(batch.id)
                    raise RuntimeError(f"batch {batch.id} not done within {timeout:.0f} s")
                await asyncio.sleep(POLL_SECONDS)
                batch = await client.batches.retrieve(batch.id)
            seconds = time.perf_counter() - began
            if batch.status != "completed":
                raise RuntimeError(f"batch {batch.id} {batch.status}: {batch.errors}")
            texts = []
            for file_id in (batch.output_file_id, batch.error_file_id):
                texts.append((await client.files.content(file_id)).text if file_id else "")
            for file_id in (uploaded.id, batch.output_file_id, batch.error_file_id):
                if file_id:
                    await client.files.delete(file_id)
        finally:
            await client.close()
        records = batch_records(GATEWAY, point, lines, self.model_of, *texts)
        return BatchRun(records, seconds, batch.status)


def batch_sample(point: str, round_: int, run: BatchRun) -> Sample:
    return Sample(GATEWAY, point, round_, tuple(run.records), run.seconds)


async def interactive(
    system: GatewaySystem,
    adapters: Sequence[BenchAdapter],
    sizes: BatchSizes,
    rate: float,
    seconds: float,
    round_: int,
    point: str,
    until: asyncio.Event | None = None,
) -> Sample:
    records, wall = await run_workload(
        system.base_url, system.name, point, sizes.interactive_plan(rate, seconds, round_),
        lambda p: system.call_for(p, adapters), drain_seconds=DRAIN_SECONDS, until=until,
    )  # fmt: skip
    return Sample(GATEWAY, point, round_, tuple(records), wall)


async def started_batch(
    tenant: BatchTenant, config: BatchBenchConfig, point: str
) -> tuple[asyncio.Task[BatchRun], asyncio.Event]:
    """A batch run as ``point``, once it has been created (or has failed to be): its task,
    and an event set when it has ended."""
    done, created = asyncio.Event(), asyncio.Event()

    async def batch() -> BatchRun:
        try:
            return await tenant.run(config.sizes, point, config.timeout_seconds, created)
        finally:
            created.set()
            done.set()

    running = asyncio.create_task(batch())
    await created.wait()
    return running, done


async def with_batch(
    system: GatewaySystem,
    adapters: Sequence[BenchAdapter],
    tenant: BatchTenant,
    config: BatchBenchConfig,
    rate: float,
    round_: int,
) -> tuple[Sample, BatchRun]:
    """The interactive load from the batch's creation until it has completed."""
    running, done = await started_batch(tenant, config, BATCH_BESIDE)
    load = await interactive(
        system, adapters, config.sizes, rate, config.timeout_seconds, round_,
        INTERACTIVE_WITH, until=done,
    )  # fmt: skip
    return load, await running


async def one_round(
    system: GatewaySystem,
    adapters: Sequence[BenchAdapter],
    tenant: BatchTenant,
    config: BatchBenchConfig,
    round_: int,
    rate: float | None,
    load_seconds: float | None,
    say: Callable[[str], None],
) -> tuple[list[Sample], float | None, float | None]:
    """One round's samples, the interactive rate (set by round 1's saturation) and how long
    the run with the batch took (the run without it lasts as long); with ``alone_only``,
    neither (no interactive load runs)."""
    sizes = config.sizes
    if config.alone_only:
        return await online_and_alone(system, tenant, config, round_, say), rate, load_seconds
    records, wall = await run_closed_loop(
        system.base_url, system.name, BATCH_SATURATION, sizes.saturation_plan(),
        lambda p: system.call_for(p, adapters), concurrency=sizes.saturation_concurrency,
        timeout_seconds=config.timeout_seconds,
    )  # fmt: skip
    saturation = Sample(GATEWAY, BATCH_SATURATION, round_, tuple(records), wall)
    if rate is None:
        rate = sizes.load * (REQUESTS_PS.of(saturation) or 0.0)
        if rate <= 0:
            raise RuntimeError("(a) completed nothing at saturation")
    say(f"round {round_ + 1}: (a) at saturation {OUTPUT_TPS.of(saturation) or 0:.1f} tok/s")
    online, alone = await online_and_alone(system, tenant, config, round_, say)
    samples = [saturation, online, alone]
    # Without the batch first in odd rounds, for as long as the last run with it took.
    without: Sample | None = None
    if round_ % 2 == 1 and load_seconds is not None:
        without = await interactive(
            system, adapters, sizes, rate, load_seconds, round_, INTERACTIVE_WITHOUT
        )
    load, beside_run = await with_batch(system, adapters, tenant, config, rate, round_)
    load_seconds = beside_run.seconds
    if without is None:
        without = await interactive(
            system, adapters, sizes, rate, load_seconds, round_, INTERACTIVE_WITHOUT
        )
    beside = batch_sample(BATCH_BESIDE, round_, beside_run)
    counters = {
        BATCH_ALONE_TPS: OUTPUT_TPS.of(alone) or 0.0,
        SATURATION_TPS: OUTPUT_TPS.of(saturation) or 0.0,
    }
    left = Sample(GATEWAY, CAPACITY_LEFT, round_, load.records, load.wall_seconds, counters)
    say(f"round {round_ + 1}: batch beside the load {OUTPUT_TPS.of(beside) or 0:.1f} tok/s, "
        f"{beside_run.seconds:.0f} s; load TTFT p99 {_ms(TTFT_P99, load)} ms with, "
        f"{_ms(TTFT_P99, without)} ms without")  # fmt: skip
    return [*samples, beside, load, without, left], rate, load_seconds


async def online_and_alone(
    system: GatewaySystem,
    tenant: BatchTenant,
    config: BatchBenchConfig,
    round_: int,
    say: Callable[[str], None],
) -> list[Sample]:
    """The batch's lines sent online at saturation, then the same lines as a batch alone."""
    sizes = config.sizes
    records, wall = await run_closed_loop(
        system.base_url, system.name, BATCH_ONLINE, sizes.batch_plan(), tenant.call_for,
        concurrency=sizes.online_concurrency, timeout_seconds=config.timeout_seconds,
    )  # fmt: skip
    online = Sample(GATEWAY, BATCH_ONLINE, round_, tuple(records), wall)
    say(f"round {round_ + 1}: lines online {OUTPUT_TPS.of(online) or 0:.1f} tok/s, {wall:.0f} s")
    if config.probe_rate <= 0:
        alone_run = await tenant.run(sizes, BATCH_ALONE, config.timeout_seconds)
        probes: list[Sample] = []
    else:
        alone_run, probes = await alone_with_probes(system, tenant, config, round_)
        say(f"round {round_ + 1}: probes' TTFT p99 {_ms(TTFT_P99, probes[0])} ms beside the "
            f"batch alone, {_ms(TTFT_P99, probes[1])} ms without")  # fmt: skip
    alone = batch_sample(BATCH_ALONE, round_, alone_run)
    say(f"round {round_ + 1}: batch alone {OUTPUT_TPS.of(alone) or 0:.1f} tok/s, "
        f"{alone_run.seconds:.0f} s")  # fmt: skip
    return [online, alone, *probes]


async def alone_with_probes(
    system: GatewaySystem, tenant: BatchTenant, config: BatchBenchConfig, round_: int
) -> tuple[BatchRun, list[Sample]]:
    """The batch alone with one-token probes from (a)'s tenants at ``probe_rate`` from its
    creation until it has completed, then the same probes with no batch, as long."""
    running, done = await started_batch(tenant, config, BATCH_ALONE)
    timeout = config.timeout_seconds
    beside = await probe(system, tenant, config, round_, PROBES_BESIDE, timeout, done)
    run_ = await running
    without = await probe(system, tenant, config, round_, PROBES_ALONE, run_.seconds)
    return run_, [beside, without]


def probe_plan(sizes: BatchSizes, rate: float, seconds: float, round_: int) -> list[PlannedRequest]:
    """(a)'s open loop at ``rate`` for ``seconds``, each request cut to one output token: it
    ends with its first token, so that the batch is alone again at once."""
    return [replace(p, max_tokens=1) for p in sizes.interactive_plan(rate, seconds, round_)]


async def probe(
    system: GatewaySystem,
    tenant: BatchTenant,
    config: BatchBenchConfig,
    round_: int,
    point: str,
    seconds: float,
    until: asyncio.Event | None = None,
) -> Sample:
    plan = probe_plan(config.sizes, config.probe_rate, seconds, round_)
    records, wall = await run_workload(
        system.base_url, system.name, point, plan,
        lambda p: system.call_for(p, tenant.adapters), drain_seconds=DRAIN_SECONDS, until=until,
    )  # fmt: skip
    return Sample(GATEWAY, point, round_, tuple(records), wall)


def _ms(figure: Figure, sample: Sample) -> str:
    value = figure.of(sample)
    return "-" if value is None else f"{value * 1000:.0f}"


POINT_FIGURES = (OUTPUT_TPS, REQUESTS_PS, TTFT_P50, TTFT_P99, TPOT_P50)


def render(samples: Sequence[Sample], context: dict[str, Any]) -> tuple[str, list[TargetResult]]:
    """The report's markdown, and the targets' results."""
    targets = evaluate_batches(samples, context["seed"], context["draws"])
    points = list(dict.fromkeys(s.point for s in samples if s.point != CAPACITY_LEFT))
    lines = [
        "# Benchmark (f): batches beside interactive traffic",
        "",
        f"- command: `{context['command']}`",
        f"- when (UTC): {context['started']}; wall time {context['wall_seconds']:.0f} s; "
        f"machine: {context['machine']}",
        f"- sizes: {context['sizes']}",
        *(
            [f"- gateway settings: {', '.join(settings)}"]
            if (settings := context.get("gateway_settings"))
            else []
        ),
        (
            f"- interactive rate: {context['rate']:.3f} req/s ({context['load']:.0%} of round "
            "1's saturation)"
            if context["rate"] is not None
            else "- no interactive load (`--alone-only`): the lines online and the batch alone"
        ),
        f"- the batch's time, upload to `completed` (s), by round: alone "
        f"{context['alone_seconds']}, beside the load {context['beside_seconds']}",
        f"- {BOOTSTRAP.format(draws=context['draws'], seed=context['seed'])}",
        "",
        "| point | " + " | ".join(f.label for f in POINT_FIGURES) + " | errors / requests |",
        "|---|" + "---:|" * (len(POINT_FIGURES) + 1),
    ]
    for point in points:
        group = [s for s in samples if s.point == point]
        cells = []
        for figure in POINT_FIGURES:
            value = median_of_rounds(figure, group)
            cells.append("-" if value is None else f"{value * figure.scale:.{figure.digits}f}")
        errors = f"{sum(s.errors for s in group)} / {sum(len(s.records) for s in group)}"
        lines.append(f"| {point} | " + " | ".join(cells) + f" | {errors} |")
    lines += ["", "## Targets", "", "| target | verdict | ratio [95%] | |", "|---|---|---|---|"]
    lines += [t.row() for t in targets]
    return "\n".join(lines) + "\n", targets


async def run(config: BatchBenchConfig, settings: Settings, command: str) -> Path:
    started_at = datetime.now(timezone.utc)
    out_dir = config.out / f"batches-{started_at:%Y%m%dT%H%M%SZ}"
    work_dir = out_dir / "tmp"
    work_dir.mkdir(parents=True, exist_ok=True)
    clock = time.perf_counter()

    def say(text: str) -> None:
        print(f"[{time.perf_counter() - clock:6.0f} s] {text}", flush=True)

    bench = BenchConfig(adapters=config.sizes.adapters)
    engine = scenario_engine(bench, settings)
    adapters = await asyncio.to_thread(
        ensure_bench_adapters, Path(settings.model), bench.adapter_cache, config.sizes.adapters
    )
    system = GatewaySystem(
        engine, bench.adapter_cache, work_dir, name=GATEWAY, extra=dict(config.gateway_settings)
    )
    tenant = BatchTenant(system, adapters)
    samples: list[Sample] = []
    rate: float | None = None
    load_seconds: float | None = None
    alone_seconds: list[float] = []
    beside_seconds: list[float] = []
    try:
        startup = await system.start(adapters, out_dir / "logs" / "gateway.log")
        say(f"gateway ready in {startup:.0f} s")
        await tenant.provision()
        await warm_up(system, adapters)
        for round_ in range(config.rounds):
            measured, rate, load_seconds = await one_round(
                system, adapters, tenant, config, round_, rate, load_seconds, say
            )
            samples += measured
            alone_seconds.append(next(s.wall_seconds for s in measured if s.point == BATCH_ALONE))
            if load_seconds is not None:
                beside_seconds.append(load_seconds)
    finally:
        await asyncio.to_thread(system.stop)
    context = {
        "command": command,
        "started": started_at.isoformat(timespec="seconds"),
        "wall_seconds": time.perf_counter() - clock,
        "machine": _machine(),
        "sizes": _sizes_text(config.sizes),
        "gateway_settings": [f"LORA_GATEWAY_{n}={v}" for n, v in config.gateway_settings],
        "config": {**asdict(config.sizes), "rounds": config.rounds},
        "rate": rate,
        "load": config.sizes.load,
        "alone_seconds": ", ".join(f"{s:.0f}" for s in alone_seconds),
        "beside_seconds": ", ".join(f"{s:.0f}" for s in beside_seconds) or "-",
        "seed": config.sizes.seed,
        "draws": config.draws,
    }
    text, targets = render(samples, context)
    # The capacity left is the load's records again, under another point: written once.
    write_requests(out_dir / "requests.jsonl", [s for s in samples if s.point != CAPACITY_LEFT])
    (out_dir / "summary.md").write_text(text)
    summary = {
        "context": context,
        "samples": [
            {"point": s.point, "round": s.round, "wall_seconds": s.wall_seconds,
             "requests": len(s.records), "errors": s.errors, "counters": dict(s.counters),
             **{f.name: f.of(s) for f in POINT_FIGURES}}
            for s in samples
        ],
        "targets": [{**asdict(t), "resolved": t.resolved} for t in targets],
    }  # fmt: skip
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(text)
    print(f"results: {out_dir}")
    return out_dir


def _machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}"


def _sizes_text(sizes: BatchSizes) -> str:
    return (
        f"a batch of {sizes.lines} lines, {sizes.line_tokens} output tokens each ((a)'s prompts, "
        f"adapters and popularity); (a)'s interactive load ({sizes.adapters} adapters, Zipf "
        f"{sizes.zipf:g}, {sizes.base_share:.0%} base model, {sizes.output_tokens} output "
        f"tokens) at {sizes.load:.0%} of its saturation at concurrency "
        f"{sizes.saturation_concurrency}; the lines online at concurrency "
        f"{sizes.online_concurrency}"
    )


def parse(argv: Sequence[str] | None = None) -> BatchBenchConfig:
    parser = argparse.ArgumentParser(prog="python -m bench.batches", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one round of a 50-line batch")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--batch-lines", type=int, help="lines of the batch (default 2000)")
    parser.add_argument(
        "--line-tokens", type=int, help="output tokens of each line (default 32, (a)'s)"
    )
    parser.add_argument("--load", type=float, help="interactive load, share of saturation")
    parser.add_argument("--online-concurrency", type=int, help="the lines sent online")
    parser.add_argument(
        "--gateway-settings", type=settings_pairs, help="more LORA_GATEWAY_* settings, e.g. "
        "BATCH_CONCURRENCY=32",
    )  # fmt: skip
    parser.add_argument(
        "--alone-only", action="store_true",
        help="each round only the lines online and the batch alone (batches.alone)",
    )  # fmt: skip
    parser.add_argument(
        "--probe-rate", type=float,
        help="one-token interactive probes a second beside the batch alone, then as long "
        "without it",
    )  # fmt: skip
    parser.add_argument("--draws", type=int)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    config = BatchBenchConfig.quick() if args.quick else BatchBenchConfig()
    sizes = {
        name: value
        for name, value in (
            ("lines", args.batch_lines), ("line_tokens", args.line_tokens),
            ("load", args.load), ("online_concurrency", args.online_concurrency),
        )
        if value is not None
    }  # fmt: skip
    top = {
        name: value
        for name, value in (
            ("rounds", args.rounds),
            ("draws", args.draws),
            ("out", args.out),
            ("gateway_settings", args.gateway_settings),
            ("alone_only", args.alone_only or None),
            ("probe_rate", args.probe_rate),
        )
        if value is not None
    }
    try:
        return replace(config, sizes=replace(config.sizes, **sizes), **top)
    except ValueError as exc:
        parser.error(str(exc))


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    config = parse(arguments)
    command = " ".join(["python -m bench.batches", *arguments])
    asyncio.run(run(config, Settings(), command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
