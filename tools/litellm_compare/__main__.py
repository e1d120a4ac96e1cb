"""Our front beside LiteLLM's proxy, over the same paced upstream: added latency and CPU.

``python -m tools.litellm_compare`` (``make litellm-compare``) sets up LiteLLM's proxy itself
(:mod:`tools.litellm_compare.litellm_proxy`: ``litellm[proxy]`` at a pinned version, in a venv
under ``var/``, offline, a master key and one model) and starts, beside it, lora-gateway in
the front role (:func:`tools.gateway_cost.__main__.gateway`: a tenant with a key and a quota,
every request recorded in the ledger), both over one paced upstream
(:mod:`tools.gateway_cost.upstream`). The systems run on the cores of ``--proxy-cpus``; this
process (the client) and the upstream on those of ``--client-cpus``.

At the start, each system's capacity: requests per second in a closed loop of
``max_tokens`` 1 at ``--capacity-streams``. Then, in each of ``--rounds`` rounds:

* at each ``--fractions`` of the lower capacity, an open loop of Poisson arrivals (the same
  times for each) against the upstream alone, our front and LiteLLM's proxy, in an order that
  alternates by round: latency p50 and p99, and the added latency (less the upstream
  alone's at the same load), and the CPU (user + system) the system's processes spent per
  request;
* each system's own maximum (the closed loop again);
* the CPU per streamed token: a closed loop of ``--tokens`` tokens a request against one of
  a token, the difference over the tokens beyond the first.

Medians and the spread over rounds are printed and written to
``var/litellm-compare/<time>.json``. On a shared machine, the CPU figures are the ones to
read: latency moves with whatever else runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

from tools.gateway_cost.__main__ import gateway, upstream
from tools.litellm_compare.client import LoopResult, Target, closed_loop, open_loop
from tools.litellm_compare.figures import (
    DIRECT,
    LITELLM,
    OURS,
    SYSTEMS,
    Point,
    format_report,
    load_rates,
    per_token_us,
    point_figures,
    poisson_arrivals,
    ratios,
    summarise,
    summary,
)
from tools.litellm_compare.litellm_proxy import (
    LITELLM_VERSION,
    MASTER_KEY,
    MODEL,
    ensure_venv,
    litellm_proxy,
)
from tools.litellm_compare.processes import parse_cpus, pin, tree_cpu_times

HOST = "127.0.0.1"
SETTLE_SECONDS = 0.5
"""After a stretch of load, the time the systems get to finish their bookkeeping (the
ledger, LiteLLM's callbacks), inside the measured window."""


def measure(
    system: str,
    load: str,
    pid: int | None,
    run: Callable[[], Coroutine[Any, Any, LoopResult]],
    offered_rate: float | None,
) -> Point:
    before = tree_cpu_times(pid) if pid else (0.0, 0.0)
    result = asyncio.run(run())
    time.sleep(SETTLE_SECONDS)
    after = tree_cpu_times(pid) if pid else (0.0, 0.0)
    user, kernel = after[0] - before[0], after[1] - before[1]
    if result.errors:
        print(f"  {system} at {load}: {result.errors} errors, the first: {result.first_error}")
    return Point(system, load, offered_rate, result.requests, result.errors,
                 result.wall_seconds, user + kernel, kernel, result.latencies)  # fmt: skip


def upstream_pid() -> int:
    """The paced upstream's process: the child of this one that runs it."""
    for child in psutil.Process().children():
        if "tools.gateway_cost.upstream" in child.cmdline():
            return int(child.pid)
    raise RuntimeError("no upstream process among this one's children")


def idle_cpu_us_per_second(pid: int, seconds: float) -> float:
    before = sum(tree_cpu_times(pid))
    time.sleep(seconds)
    return (sum(tree_cpu_times(pid)) - before) / seconds * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5, 0.9])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of an open loop")
    parser.add_argument("--min-requests", type=int, default=200, help="of an open loop")
    parser.add_argument("--capacity-streams", type=int, default=32)
    parser.add_argument("--capacity-requests", type=int, default=1024)
    parser.add_argument("--token-streams", type=int, default=16)
    parser.add_argument("--token-requests", type=int, default=256, help="per token phase")
    parser.add_argument("--tokens", type=int, default=64, help="max_tokens of a long request")
    parser.add_argument(
        "--rate", type=float, default=100_000, help="tokens/s the upstream makes over all streams"
    )
    parser.add_argument("--proxy-cpus", default="1", help="cores of the systems compared")
    parser.add_argument("--client-cpus", default="0", help="cores of the client and upstream")
    parser.add_argument("--idle-seconds", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--venv", type=Path, default=Path("var/litellm-compare/venv"))
    parser.add_argument("--out", type=Path, default=Path("var/litellm-compare"))
    args = parser.parse_args(argv)
    proxy_cpus, client_cpus = parse_cpus(args.proxy_cpus), parse_cpus(args.client_cpus)

    litellm = ensure_venv(args.venv)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    with (
        tempfile.TemporaryDirectory(prefix="litellm-compare-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        workdir = Path(tmp)
        pacing = [f"--rate={args.rate}", "--stream-interval=1"]
        upstream_url = stack.enter_context(upstream(workdir / "upstream", pacing))
        front = stack.enter_context(gateway(workdir / "front", pacing, upstream_url=upstream_url))
        litellm_pid, litellm_port = stack.enter_context(
            litellm_proxy(workdir / "litellm", litellm, upstream_url)
        )
        pids: dict[str, int | None] = {DIRECT: None, OURS: front.process.pid, LITELLM: litellm_pid}
        # Pinned once started: start-up on one core of a busy machine takes minutes.
        for system in SYSTEMS:
            pin(int(pids[system] or 0), proxy_cpus, children=True)
        pin(upstream_pid(), client_cpus, children=True)
        pin(os.getpid(), client_cpus, children=False)
        targets = {
            DIRECT: Target(HOST, int(urlsplit(upstream_url).port or 0), "none", MODEL),
            OURS: Target(HOST, front.port, front.key, front.model),
            LITELLM: Target(HOST, litellm_port, MASTER_KEY, MODEL),
        }
        report = run(args, targets, pids)
    report.update(
        time=stamp,
        command=" ".join(["python -m tools.litellm_compare", *(argv or sys.argv[1:])]),
        machine={
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_1m": os.getloadavg()[0],
        },
    )
    report["settings"].update(
        litellm_version=LITELLM_VERSION,
        pinning=f"proxy under test on cores {sorted(proxy_cpus)}; "
        f"client and upstream on cores {sorted(client_cpus)}",
    )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{stamp}.json"
    path.write_text(json.dumps(report, indent=1))
    print(format_report(report))
    print(f"idle CPU (us per second): {report['idle_us_per_second']}")
    print(f"written to {path}")
    return 0


def run(
    args: argparse.Namespace, targets: dict[str, Target], pids: dict[str, int | None]
) -> dict[str, Any]:
    each = max(1, args.capacity_requests // args.capacity_streams)
    token_each = max(1, args.token_requests // args.token_streams)

    def saturate(system: str) -> Point:
        target = targets[system]
        return measure(
            system, "max", pids[system],
            lambda: closed_loop(target, args.capacity_streams, each, 1), None,
        )  # fmt: skip

    for system in SYSTEMS:  # warm-up: connections, lazy imports, caches
        asyncio.run(closed_loop(targets[system], args.token_streams, 4, 1))
        asyncio.run(closed_loop(targets[system], args.token_streams, 2, args.tokens))
    capacities = {system: saturate(system).achieved_rate for system in SYSTEMS}
    rates = load_rates(capacities, args.fractions)
    print(f"capacities (requests/s): {capacities}; loads: {rates}", flush=True)

    rounds: list[dict[str, dict[str, dict[str, float | None]]]] = []
    token_rows: dict[str, dict[str, list[float | None]]] = {
        s: {"token_us": [], "token_system_us": []} for s in SYSTEMS
    }
    for round_number in range(args.rounds):
        order = [DIRECT, *SYSTEMS] if round_number % 2 == 0 else [DIRECT, *reversed(SYSTEMS)]
        figures: dict[str, dict[str, dict[str, float | None]]] = {s: {} for s in order}
        for label, rate in rates.items():
            count = max(args.min_requests, int(rate * args.seconds))
            arrivals = poisson_arrivals(rate, count, args.seed + round_number)
            points: dict[str, Point] = {}
            for system in order:
                target = targets[system]
                points[system] = measure(
                    system, label, pids[system],
                    partial(open_loop, target, arrivals, 1), rate,
                )  # fmt: skip
            for system, point in points.items():
                direct = None if system == DIRECT else points[DIRECT]
                figures[system][label] = point_figures(point, direct)
        for system in order[1:]:
            figures[system]["max"] = point_figures(saturate(system), None)
            target = targets[system]
            short = measure(system, "tokens, short", pids[system],
                            partial(closed_loop, target, args.token_streams, token_each, 1),
                            None)  # fmt: skip
            long = measure(
                system, "tokens, long", pids[system],
                partial(closed_loop, target, args.token_streams, token_each, args.tokens),
                None,
            )  # fmt: skip
            token_rows[system]["token_us"].append(
                per_token_us(short.cpu_per_request_us, long.cpu_per_request_us, args.tokens)
            )
            short_kernel = short.system_seconds / short.requests * 1e6
            long_kernel = long.system_seconds / long.requests * 1e6
            token_rows[system]["token_system_us"].append(
                per_token_us(short_kernel, long_kernel, args.tokens)
            )
        rounds.append(figures)
        done = ", ".join(
            f"{s} {figures[s][label]['cpu_per_request_us']:.0f} us/request at {label}"
            for s in SYSTEMS
            for label in list(rates)[-1:]
        )
        print(f"round {round_number + 1}: {done}", flush=True)

    idle = {s: idle_cpu_us_per_second(int(pids[s] or 0), args.idle_seconds) for s in SYSTEMS}
    return {
        "settings": {
            "rounds": args.rounds,
            "fractions": args.fractions,
            "seconds": args.seconds,
            "capacity_streams": args.capacity_streams,
            "token_streams": args.token_streams,
            "tokens": args.tokens,
            "upstream_rate": args.rate,
        },
        "capacities": capacities,
        "loads": rates,
        "results": summarise(rounds),
        "ratios": ratios(rounds),
        "tokens": {
            s: {name: summary(values) for name, values in rows.items()}
            for s, rows in token_rows.items()
        },
        "idle_us_per_second": idle,
        "rounds": rounds,
    }


if __name__ == "__main__":
    raise SystemExit(main())
