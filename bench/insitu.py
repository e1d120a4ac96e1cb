"""Where a scenario's time goes, in situ: ``python -m bench.insitu c``, ``... a`` or ``... e``.

A sampling profiler (py-spy, ``pip install py-spy``: not a dependency) records every process
of the system under test while each point of a scenario runs: the server (the gateway, or
vLLM's API server), vLLM's engine core and its model worker. Scenario c is the closed loop
over 1 adapter and over 1,000 registered ones, on the gateway; scenario a is the saturation
closed loop on the gateway and on vLLM's server with our ops, taking turns; scenario e is the
grid's quick points (``bench.grid``), vLLM's server first in each round. Each profile is
written as py-spy's raw folded stacks, and ``summary.md`` accounts each process's samples by
what they were doing (the ``ACCOUNTS`` below), per point and system, so that two points or
two systems are compared share by share. The profiler samples at 50 Hz without stopping the
process; it costs some CPU of its own, so read shares and differences, not absolute rates.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import bench.scenarios
from app.settings import Settings
from bench.config import GATEWAY, VLLM, BenchConfig
from bench.grid import GridConfig
from bench.grid_run import run_grid
from bench.random_adapters import ensure_bench_adapters
from bench.runner import build_system, registered_phase, scenario_engine, warm_up
from bench.scenarios import Measure, saturation
from bench.stats import Sample
from bench.status import StatusLine
from bench.systems import EngineConfig, System

RATE_HZ = 50
# What a sample was doing: the first account with a frame (a substring of py-spy's
# "function (file:line)") anywhere in its stack; "other" when none matches.
ACCOUNTS: dict[str, tuple[str, ...]] = {
    "adapter loads from storage": ("WorkerLoRAManager._load_adapter (",),
    "adapter activations": ("LoRAModelManager.activate_adapter (",),
    "the step's adapters, the rest": ("set_active_adapters (vllm/lora/worker_manager.py",),
    "our ops: preparing a changed slot": ("PreparedLoRA.of (app/inside_vllm/lora_weights.py",),
    "our ops: the LoRA products": ("(app/inside_vllm/punica_wrapper.py",),
    "base model matmuls": ("cpu_unquantized_gemm (",),
    "attention": ("cpu_attention_with_kv_cache (",),
    "sampling": ("Sampler.forward (",),
    "waiting for the other process": ("MessageQueue.dequeue (", "MessageQueue.acquire_read ("),
    "the engine core's scheduler": ("Scheduler.schedule (", "Scheduler.update_from_output ("),
    "the server's event loop and requests": ("Runner.run (asyncio/runners.py",),
}
OTHER = "other"


@dataclass(frozen=True)
class Profile:
    """One process's folded stacks over one point."""

    point: str
    system: str
    process: str
    stacks: Counter[str]

    @property
    def samples(self) -> int:
        return sum(self.stacks.values())

    def accounted(self) -> Counter[str]:
        shares: Counter[str] = Counter()
        for stack, count in self.stacks.items():
            name = next(
                (n for n, marks in ACCOUNTS.items() if any(m in stack for m in marks)), OTHER
            )
            shares[name] += count
        return shares


def read_folded(path: Path) -> Counter[str]:
    """py-spy's folded stacks; a line that does not end in a count (py-spy stopped while it
    wrote, which leaves bytes of memory in the file) is left out."""
    stacks: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdecimal():
            stacks[stack] += int(count)
    return stacks


def _descendants(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    children = [int(child) for child in found.split()]
    return children + [g for child in children for g in _descendants(child)]


def server_processes(system: System) -> list[tuple[str, int]]:
    """The system's server process, and vLLM's processes below it, named."""
    top = system.pid
    if top is None:
        return []
    named = [("server", top)]
    for pid in _descendants(top):
        with contextlib.suppress(OSError):
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            if name.startswith("VLLM::"):
                named.append((name.removeprefix("VLLM::").replace(":", ""), pid))
    return named


class Recorder:
    """Runs py-spy on a system's processes around each point it measures."""

    def __init__(self, py_spy: str, out_dir: Path) -> None:
        self.py_spy = py_spy
        self.out_dir = out_dir
        self.profiles: list[Profile] = []
        self.runs: list[Sample] = []

    @contextlib.asynccontextmanager
    async def recording(self, system: System, point: str, round_: int) -> AsyncIterator[None]:
        stem = re.sub(r"[^\w.-]+", "_", f"r{round_}-{system.name}-{point}")
        files, spies = [], []
        for process, pid in server_processes(system):
            path = self.out_dir / f"{stem}.{process}.txt"
            argv = [self.py_spy, "record", "--pid", str(pid), "--rate", str(RATE_HZ)]
            argv += ["--format", "raw", "--nonblocking", "--output", str(path)]
            spies.append(
                subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            )
            files.append((process, path))
        try:
            yield
        finally:
            for spy in spies:
                spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            for spy in spies:
                await asyncio.to_thread(spy.wait, 60)
        for process, path in files:
            if path.is_file():
                self.profiles.append(Profile(point, system.name, process, read_folded(path)))

    @contextlib.contextmanager
    def around_every_point(self) -> Iterator[None]:
        """Each point the scenarios measure, recorded (``bench.scenarios`` samples every
        point through ``sample_of``)."""
        sample = bench.scenarios.sample_of

        async def recorded(system: System, point: str, round_: int, measure: Measure) -> Sample:
            async with self.recording(system, point, round_):
                measured = await sample(system, point, round_, measure)
            self.runs.append(measured)
            return measured

        bench.scenarios.sample_of = recorded
        try:
            yield
        finally:
            bench.scenarios.sample_of = sample


def summary(profiles: Sequence[Profile], runs: Sequence[Sample] = ()) -> str:
    """Each (point, system)'s output over its rounds, then per process its samples by
    account, with their shares (a sample is 1 / ``RATE_HZ`` s of a busy process)."""
    lines = ["# In-situ profile", "", f"py-spy at {RATE_HZ} Hz; figures summed over rounds.", ""]
    if runs:
        lines += ["| point, system | rounds | seconds | output tokens | output tok/s |"]
        lines.append("|---|---:|---:|---:|---:|")
        for point, system in dict.fromkeys((r.point, r.system) for r in runs):
            these = [r for r in runs if (r.point, r.system) == (point, system)]
            seconds = sum(r.wall_seconds for r in these)
            tokens = sum(record.output_tokens for r in these for record in r.records)
            lines.append(
                f"| {point}, {system} | {len(these)} | {seconds:.1f} | {tokens} "
                f"| {tokens / seconds:.1f} |"
            )
        lines.append("")
    for process in sorted({p.process for p in profiles}):
        columns: dict[tuple[str, str], Counter[str]] = {}
        for profile in profiles:
            if profile.process == process:
                key = (profile.point, profile.system)
                columns[key] = columns.get(key, Counter()) + profile.accounted()
        names = [n for n in [*ACCOUNTS, OTHER] if any(c[n] for c in columns.values())]
        heads = [f"{point}, {system}" for point, system in columns]
        lines += [f"## {process}", "", "| account | " + " | ".join(heads) + " |"]
        lines.append("|---|" + "---:|" * len(heads))
        for name in names:
            cells = [f"{c[name]} ({c[name] / max(1, c.total()):.0%})" for c in columns.values()]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append(
            "| all samples | " + " | ".join(str(c.total()) for c in columns.values()) + " |"
        )
        lines.append("")
    return "\n".join(lines)


async def profile_c(config: BenchConfig, settings: Settings, out_dir: Path, spy: Recorder) -> None:
    status = StatusLine(2 * config.rounds * config.registered_requests)
    with spy.around_every_point():
        await registered_phase(
            config, EngineConfig(settings), Path(settings.model), out_dir / "tmp", out_dir, status
        )
    status.finish()


async def profile_a(config: BenchConfig, settings: Settings, out_dir: Path, spy: Recorder) -> None:
    engine = scenario_engine(config, settings)
    adapters = await asyncio.to_thread(
        ensure_bench_adapters, Path(settings.model), config.adapter_cache, config.adapters
    )
    with spy.around_every_point():
        for round_ in range(config.rounds):
            for name in (GATEWAY, VLLM)[:: 1 if round_ % 2 == 0 else -1]:
                system = build_system(name, engine, config.adapter_cache, out_dir / "tmp", config)
                try:
                    await system.start(adapters, out_dir / "logs" / f"{name}-round{round_ + 1}.log")
                    await warm_up(system, adapters)
                    await saturation(system, adapters, config, round_, lambda *_: None)
                finally:
                    await asyncio.to_thread(system.stop)


async def profile_e(rounds: int, settings: Settings, out_dir: Path, spy: Recorder) -> None:
    config = replace(GridConfig.quick(), rounds=rounds, out=out_dir)
    with spy.around_every_point():
        await run_grid(config, settings, "python -m bench.insitu e")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.insitu", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("scenario", choices=("a", "c", "e"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64, help="a: closed-loop concurrency")
    parser.add_argument("--registered", type=int, default=1000, help="c: adapters registered")
    parser.add_argument("--py-spy", default=shutil.which("py-spy"), help="the py-spy binary")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    if not args.py_spy:
        parser.error("py-spy not found: pip install py-spy, or give --py-spy")
    started = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_dir = args.out / f"insitu-{args.scenario}-{started}"
    (out_dir / "logs").mkdir(parents=True)
    config = replace(
        BenchConfig(), rounds=args.rounds, concurrencies=(args.concurrency,), waves=2,
        registered=args.registered, cliff_multiples=(),
    )  # fmt: skip
    spy = Recorder(args.py_spy, out_dir)
    if args.scenario == "e":
        asyncio.run(profile_e(args.rounds, Settings(), out_dir, spy))
    else:
        run = profile_c if args.scenario == "c" else profile_a
        asyncio.run(run(config, Settings(), out_dir, spy))
    text = summary(spy.profiles, spy.runs)
    (out_dir / "summary.md").write_text(text + "\n")
    print(text)
    print(f"\nprofiles and summary in {out_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
