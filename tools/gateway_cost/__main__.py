"""The gateway's own CPU cost per request and per streamed token, without an engine.

``python -m tools.gateway_cost`` (``make gateway-cost``) starts the gateway
(:mod:`tools.gateway_cost.server`: the real app over a :class:`PacedEngine` that gives every
running request one token per step) as a process of its own, and drives it from this one
over HTTP on loopback. For each concurrency (``--streams``), in ``--rounds`` interleaved
rounds, two phases run with that many streams, each stream sending its requests one after
another:

* short: ``max_tokens`` 1, the cost of a request with as little streaming as there is;
* long: ``max_tokens`` ``--tokens``.

The gateway process's CPU time (user + system, all its threads; not wall time) is read
before and after each phase, to the nanosecond (:mod:`tools.gateway_cost.cpu`; its kernel's
part in the kernel's 10 ms ticks). A request costs the short phase's CPU per request; a token, the
long phase's CPU per request less that, over the tokens beyond the first.

Part of a token's cost is the stand-in engine's (its steps, its outputs, waking the reader),
which vLLM's own output processing replaces in production. The same two phases run once more
each round with the engine read directly in the gateway process, nothing of the gateway
around it; the gateway's own cost per token is the difference, round by round.

With ``--role front`` the measured process is a front (the front role, the embedded model's
tokenizer) over :mod:`tools.gateway_cost.upstream`, a paced upstream in a process of its own:
the front's process holds no engine, so all of its cost per token is its own.

Each round also measures, with the same client and the same two phases:

* the reference: a minimal SSE server (:mod:`tools.gateway_cost.upstream` in a process of its
  own: raw asyncio, one write per token, paced as the engine is), the least a Python server
  can spend streaming these tokens. The all-in ratio is the gateway's CPU per token of long
  requests, all in, over the reference's (``--no-reference`` leaves it out);
* Responses: the same requests on ``/v1/responses`` (streamed, ``store`` false), their CPU
  per request and per token over chat's in the same round (``--no-responses``);
* with ``--tracing``, tracing: a second gateway with tracing on at full sampling (OTLP over
  HTTP to a receiver in this process that counts the spans and drops them), its CPU per
  request and per token less the untraced gateway's in the same round; per request, from a
  short phase of ``--tracing-requests`` requests on each, both at once (``--streams``
  streams each, from one client, the two processes' CPU read over the same seconds, the
  untraced one's streams opened first in odd rounds and the traced one's in even rounds: on a
  shared machine, two phases one after the other differ by the other work of their seconds,
  by more than tracing's cost even with tracing off in both, and of two at once, the one
  opened first costs more a request).
  Every span must reach
  the receiver: a span the batch processor's queue dropped would cost less than one exported.

Medians and the spread over rounds are printed and written to
``var/gateway-cost/<time>.json``. With ``--profile``, one long phase more runs under cProfile
and its top entries are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import pstats
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from io import StringIO
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.targets import GATEWAY_COST_ALL_IN_LIMIT, GATEWAY_COST_LIMITS
from tools.gateway_cost.cpu import cpu_seconds
from tools.gateway_cost.load import (
    CHAT,
    RESPONSES,
    PhaseResult,
    Reading,
    chat_request,
    responses_request,
    run_phase,
)
from tools.gateway_cost.ports import HOST, free_port, wait_for_port
from tools.gateway_cost.server import ADMIN_TOKEN
from tools.gateway_cost.spans import SpanSink, span_sink, tracing_env

SETTLE_SECONDS = 0.5
"""After a phase, the time the gateway gets to settle and record its last requests (quota
reconciliation and the ledger run after the response), inside the measured window."""


@dataclass
class Gateway:
    process: subprocess.Popen[bytes]
    port: int
    key: str
    model: str

    def cpu_seconds(self) -> float:
        """CPU seconds so far, user and system, to the nanosecond."""
        return cpu_seconds(self.process.pid)

    def cpu_times(self) -> tuple[float, float]:
        """CPU seconds so far: (user, system), in the kernel's ticks."""
        times = psutil.Process(self.process.pid).cpu_times()
        return float(times.user), float(times.system)

    def idle_cpu_us_per_second(self, seconds: float) -> float:
        """What the gateway spends with no request: its timers and watchdogs."""
        before = self.cpu_seconds()
        time.sleep(seconds)
        return (self.cpu_seconds() - before) / seconds * 1e6


@contextmanager
def upstream(workdir: Path, pacing: list[str]) -> Iterator[str]:
    """The paced upstream of a front (:mod:`tools.gateway_cost.upstream`), until the block
    ends; its URL."""
    with _paced_sse_server(workdir, pacing) as (_, port):
        yield f"http://{HOST}:{port}"


@contextmanager
def reference(workdir: Path, pacing: list[str]) -> Iterator[Gateway]:
    """The reference SSE server, measured as the gateway is, until the block ends."""
    with _paced_sse_server(workdir, pacing) as (process, port):
        yield Gateway(process, port, key="reference", model="reference")


@contextmanager
def _paced_sse_server(
    workdir: Path, pacing: list[str]
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """:mod:`tools.gateway_cost.upstream` in a process of its own: the process and its
    port."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = [sys.executable, "-m", "tools.gateway_cost.upstream", f"--port={port}"]
    with (workdir / "upstream.log").open("ab") as log:
        process = subprocess.Popen([*command, *pacing], stdout=log, stderr=log)
    try:
        wait_for_port(process, port, 30, "the paced SSE server")
        yield process, port
    finally:
        _interrupt(process, 10)


@contextmanager
def gateway(
    workdir: Path,
    pacing: list[str],
    profile: Path | None = None,
    upstream_url: str | None = None,
    env: dict[str, str] | None = None,
    checkout: Path | None = None,
) -> Iterator[Gateway]:
    """The gateway (:mod:`tools.gateway_cost.server`) in a process of its own, until the block
    ends; that of ``checkout`` where one is named, else this one's."""
    workdir.mkdir(parents=True)
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "tools.gateway_cost.server",
        f"--workdir={workdir}",
        f"--port={port}",
        *pacing,
    ]
    if profile is not None:
        command.append(f"--profile={profile}")
    if upstream_url is not None:
        command.append(f"--upstream-url={upstream_url}")
    log = (workdir / "gateway.log").open("ab")
    if checkout is not None:
        env = {**(env or {}), "PYTHONPATH": str(checkout)}
    process = subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        cwd=checkout,
    )
    try:
        try:
            key, model = _set_up(port, process)
        except RuntimeError as error:
            log.flush()
            tail = (workdir / "gateway.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{error}; the end of its log:\n{tail}") from error
        yield Gateway(process, port, key, model)
    finally:
        _interrupt(process, 60)
        log.close()


def _interrupt(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGINT, then SIGKILL if ``process`` has not exited within ``timeout`` seconds."""
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _set_up(port: int, process: subprocess.Popen[bytes]) -> tuple[str, str]:
    """A tenant with a quota (so every request takes the quota path) and its key."""
    base = f"http://{HOST}:{port}"
    deadline = time.monotonic() + 120
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the gateway exited with status {process.returncode}")
        try:
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the gateway did not become ready")
        time.sleep(0.2)
    admin = httpx.Client(
        base_url=f"{base}/admin/v1", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    with admin:
        tenant = "cost"
        admin.post(
            "/tenants", json={"id": tenant, "name": "Cost", "allow_base_model": True}
        ).raise_for_status()
        admin.put(
            f"/tenants/{tenant}/quota",
            json={
                "token_budget": 10**12,
                "budget_period": "day",
                "max_concurrent_requests": 100_000,
            },
        ).raise_for_status()
        key = admin.post(f"/tenants/{tenant}/keys", json={"name": "load"}).json()["key"]
    models = httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {key}"}).json()
    return key, str(models["data"][0]["id"])


FIGURES = (
    "request_us",
    "request_system_us",
    "token_us",
    "token_system_us",
    "engine_token_us",
    "own_token_us",
    "own_token_user_us",
    "long_token_us",
    "tokens_per_event",
    "reference_request_us",
    "reference_token_us",
    "reference_long_token_us",
    "all_in_ratio",
    "responses_request_us",
    "responses_token_us",
    "responses_request_ratio",
    "responses_token_ratio",
    "traced_request_us",
    "tracing_request_us",
    "tracing_token_us",
)


@dataclass
class Phase:
    streams: int
    kind: str
    max_tokens: int
    cpu_seconds: float
    system_seconds: float
    result: PhaseResult

    @property
    def cpu_per_request_us(self) -> float:
        return self.cpu_seconds / self.result.requests * 1e6

    @property
    def system_per_request_us(self) -> float:
        """The kernel's part: mostly the socket writes, one per event."""
        return self.system_seconds / self.result.requests * 1e6


def measure(
    gw: Gateway,
    streams: int,
    max_tokens: int,
    requests_per_stream: int,
    reading: Reading = CHAT,
    of: str = "",
) -> Phase:
    """One phase on ``gw``; ``of`` names what it measures, where it is not the gateway's chat
    (``reference``, ``Responses``)."""
    (phase,) = measure_at_once([gw], streams, max_tokens, requests_per_stream, reading, [of])
    return phase


def measure_at_once(
    gateways: list[Gateway],
    streams: int,
    max_tokens: int,
    requests_per_stream: int,
    reading: Reading = CHAT,
    of: list[str] | None = None,
) -> list[Phase]:
    """One phase on each of ``gateways`` at the same time, ``streams`` streams each, from one
    client, each gateway's CPU read over the same window: whatever else the machine runs in
    those seconds weighs on each alike (``of`` names each phase, as :func:`measure`'s)."""
    build = responses_request if reading is RESPONSES else chat_request
    requests = [build(HOST, gw.port, gw.key, gw.model, max_tokens) for gw in gateways]
    before = [(gw.cpu_seconds(), gw.cpu_times()[1]) for gw in gateways]

    async def phases() -> list[PhaseResult]:
        return await asyncio.gather(
            *(
                run_phase(HOST, gw.port, request, streams, requests_per_stream, reading)
                for gw, request in zip(gateways, requests, strict=True)
            )
        )

    results = asyncio.run(phases())
    time.sleep(SETTLE_SECONDS)
    kind = "short" if max_tokens == 1 else "long"
    out = []
    for gw, (cpu_before, system_before), result, name in zip(
        gateways, before, results, of or [""] * len(gateways), strict=True
    ):
        cpu, system = gw.cpu_seconds() - cpu_before, gw.cpu_times()[1] - system_before
        expected = result.requests * max_tokens
        if result.completion_tokens != expected:
            raise RuntimeError(f"{result.completion_tokens} tokens streamed, {expected} expected")
        label = f"{name}, {kind}" if name else kind
        out.append(Phase(streams, label, max_tokens, cpu, system, result))
    return out


def measure_engine_alone(gw: Gateway, streams: int, max_tokens: int, each: int) -> Phase:
    """The same phase with the engine read directly in the gateway process."""
    before, (_, system_before) = gw.cpu_seconds(), gw.cpu_times()
    started = time.monotonic()
    answer = httpx.post(
        f"http://{HOST}:{gw.port}/cost/engine-alone",
        params={"streams": streams, "requests_per_stream": each, "max_tokens": max_tokens},
        timeout=600,
    )
    answer.raise_for_status()
    wall = time.monotonic() - started
    time.sleep(SETTLE_SECONDS)
    cpu, (_, system) = gw.cpu_seconds() - before, gw.cpu_times()
    requests = streams * each
    if answer.json() != requests * max_tokens:
        raise RuntimeError(f"{answer.json()} tokens read, {requests * max_tokens} expected")
    result = PhaseResult(requests, requests * max_tokens, 0, wall)
    kind = "engine alone, " + ("short" if max_tokens == 1 else "long")
    return Phase(streams, kind, max_tokens, cpu, system - system_before, result)


def per_token_us(short: Phase, long: Phase) -> float:
    """The CPU a streamed token adds to a request: the long request's cost beyond the short
    one's, over the tokens it streams beyond the first."""
    extra = long.cpu_per_request_us - short.cpu_per_request_us
    return extra / (long.max_tokens - short.max_tokens)


def system_per_token_us(short: Phase, long: Phase) -> float:
    extra = long.system_per_request_us - short.system_per_request_us
    return extra / (long.max_tokens - short.max_tokens)


def user_per_token_us(short: Phase, long: Phase) -> float:
    """:func:`per_token_us` in user space alone (the kernel's part is
    :func:`system_per_token_us`)."""
    return per_token_us(short, long) - system_per_token_us(short, long)


def ratio(figure: float, beside: float) -> float:
    """``figure`` over ``beside``; not a number where ``beside`` read no CPU at all (a run too
    short for the clock's ticks)."""
    return figure / beside if beside > 0 else math.nan


def all_in_per_token_us(long: Phase) -> float:
    return long.cpu_seconds / long.result.completion_tokens * 1e6


def tokens_per_content_event(phase: Phase) -> float:
    """Above 1 when chunks gather tokens (``--stream-interval``) or the gateway fell behind
    the engine and sent merged deltas (a chat stream with usage has three events without
    content: the role, the usage, ``[DONE]``)."""
    result = phase.result
    return result.completion_tokens / (result.events - 3 * result.requests)


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def profile_top(path: Path, limit: int) -> str:
    out = StringIO()
    stats = pstats.Stats(str(path), stream=out)
    stats.strip_dirs().sort_stats("tottime").print_stats(limit)
    return out.getvalue()


def measure_rounds(
    gw: Gateway,
    args: argparse.Namespace,
    ref: Gateway | None = None,
    traced: Gateway | None = None,
) -> tuple[dict[int, dict[str, list[float]]], list[Phase]]:
    """Each round: a short and a long phase at each concurrency (and the engine alone's, the
    reference's, Responses' and the traced gateway's, as asked); per concurrency, each
    figure's value in every round."""
    phases: list[Phase] = []
    rows: dict[int, dict[str, list[float]]] = {
        n: {name: [] for name in FIGURES} for n in args.streams
    }
    front = args.role == "front"  # no engine in the measured process: all its cost is its own
    for streams in args.streams:  # warm-up: first connections, lazy imports, caches
        measure(gw, streams, 1, 1)
        measure(gw, streams, args.tokens, 1)
        if not front:
            measure_engine_alone(gw, streams, args.tokens, 1)
        if ref is not None:
            measure(ref, streams, args.tokens, 1)
        if args.responses:
            measure(gw, streams, args.tokens, 1, RESPONSES)
        if traced is not None:
            measure(traced, streams, 1, 1)
            measure(traced, streams, args.tokens, 1)
    for round_number in range(args.rounds):
        for streams in args.streams:
            each = max(1, args.requests // streams)
            short = measure(gw, streams, 1, each)
            long = measure(gw, streams, args.tokens, each)
            phases += [short, long]
            engine_token = engine_token_user = 0.0
            if not front:
                engine_short = measure_engine_alone(gw, streams, 1, each)
                engine_long = measure_engine_alone(gw, streams, args.tokens, each)
                phases += [engine_short, engine_long]
                engine_token = per_token_us(engine_short, engine_long)
                engine_token_user = user_per_token_us(engine_short, engine_long)
            row = rows[streams]
            row["own_token_user_us"].append(user_per_token_us(short, long) - engine_token_user)
            if ref is not None:
                ref_short = measure(ref, streams, 1, each, of="reference")
                ref_long = measure(ref, streams, args.tokens, each, of="reference")
                phases += [ref_short, ref_long]
                row["reference_request_us"].append(ref_short.cpu_per_request_us)
                row["reference_token_us"].append(per_token_us(ref_short, ref_long))
                row["reference_long_token_us"].append(all_in_per_token_us(ref_long))
                row["all_in_ratio"].append(
                    ratio(all_in_per_token_us(long), all_in_per_token_us(ref_long))
                )
            if args.responses:
                resp_short = measure(gw, streams, 1, each, RESPONSES, "Responses")
                resp_long = measure(gw, streams, args.tokens, each, RESPONSES, "Responses")
                phases += [resp_short, resp_long]
                resp_token = per_token_us(resp_short, resp_long)
                row["responses_request_us"].append(resp_short.cpu_per_request_us)
                row["responses_token_us"].append(resp_token)
                row["responses_request_ratio"].append(
                    ratio(resp_short.cpu_per_request_us, short.cpu_per_request_us)
                )
                row["responses_token_ratio"].append(ratio(resp_token, per_token_us(short, long)))
            if traced is not None:
                each_traced = max(1, args.tracing_requests // streams)
                # Which one's streams open first weighs on its figure: each in turn.
                pair = [(gw, "untraced, beside traced"), (traced, "traced")]
                order = pair[:: -1 if round_number % 2 else 1]
                at_once = measure_at_once(
                    [g for g, _ in order], streams, 1, each_traced, of=[name for _, name in order]
                )
                beside, traced_short = at_once[:: -1 if round_number % 2 else 1]
                traced_long = measure(traced, streams, args.tokens, each, of="traced")
                phases += [beside, traced_short, traced_long]
                row["traced_request_us"].append(traced_short.cpu_per_request_us)
                row["tracing_request_us"].append(
                    traced_short.cpu_per_request_us - beside.cpu_per_request_us
                )
                row["tracing_token_us"].append(
                    per_token_us(traced_short, traced_long) - per_token_us(short, long)
                )
            row["request_us"].append(short.cpu_per_request_us)
            row["request_system_us"].append(short.system_per_request_us)
            row["token_us"].append(per_token_us(short, long))
            row["token_system_us"].append(system_per_token_us(short, long))
            row["engine_token_us"].append(engine_token)
            row["own_token_us"].append(per_token_us(short, long) - engine_token)
            row["long_token_us"].append(all_in_per_token_us(long))
            row["tokens_per_event"].append(tokens_per_content_event(long))
            print(
                f"round {round_number + 1} streams {streams}: "
                f"{short.cpu_per_request_us:.0f} us/request, "
                f"{per_token_us(short, long):.1f} us/token"
                + ("" if front else f", of which the stand-in engine alone {engine_token:.1f}"),
                flush=True,
            )
    return rows, phases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, nargs="+", default=[16, 256])
    parser.add_argument(
        "--role",
        choices=("all", "front"),
        default="all",
        help="all: the gateway over a paced engine; front: a front over a paced upstream",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64, help="max_tokens of a long request")
    parser.add_argument(
        "--requests",
        type=int,
        default=512,
        help="requests per phase (at least one per stream, a multiple of the streams)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=2000,
        help="tokens/s the engine produces over all streams (one per running request per step)",
    )
    parser.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        help="tokens a streamed chunk gathers (the gateway's LORA_GATEWAY_STREAM_INTERVAL, "
        "and the upstream's of a front)",
    )
    parser.add_argument(
        "--idle-seconds", type=float, default=5.0, help="how long the idle gateway is measured"
    )
    parser.add_argument(
        "--no-reference",
        dest="reference",
        action="store_false",
        help="leave out the reference SSE server (and the all-in ratio)",
    )
    parser.add_argument(
        "--no-responses",
        dest="responses",
        action="store_false",
        help="leave out the Responses phases",
    )
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="measure a gateway with tracing on (full sampling, OTLP/HTTP) beside the untraced",
    )
    parser.add_argument(
        "--tracing-requests",
        type=int,
        default=2048,
        help="requests of each short phase that tracing's cost per request is read from",
    )
    parser.add_argument("--profile", action="store_true", help="profile one long phase more")
    parser.add_argument("--profile-streams", type=int, default=256)
    parser.add_argument("--top", type=int, default=30, help="profile entries to print")
    parser.add_argument("--out", type=Path, default=Path("var/gateway-cost"))
    args = parser.parse_args(argv)

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    rows: dict[int, dict[str, list[float]]] = {}
    phases: list[Phase] = []
    idle_us_per_s = 0.0
    spans: SpanSink | None = None
    with (
        tempfile.TemporaryDirectory(prefix="gateway-cost-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        workdir = Path(tmp)
        pacing = [f"--rate={args.rate}", f"--stream-interval={args.stream_interval}"]
        upstream_url = (
            stack.enter_context(upstream(workdir / "upstream", pacing))
            if args.role == "front"
            else None
        )
        if args.rounds:
            ref = (
                stack.enter_context(reference(workdir / "reference", pacing))
                if args.reference
                else None
            )
            traced = None
            if args.tracing:
                spans = stack.enter_context(span_sink())
                traced = stack.enter_context(
                    gateway(
                        workdir / "traced",
                        pacing,
                        upstream_url=upstream_url,
                        env=tracing_env(spans.url),
                    )
                )
            with gateway(workdir / "measured", pacing, upstream_url=upstream_url) as gw:
                rows, phases = measure_rounds(gw, args, ref, traced)
                # After the rounds: just after start-up, the gateway is still settling.
                idle_us_per_s = gw.idle_cpu_us_per_second(args.idle_seconds)
        top = ""
        if args.profile:
            stats_file = workdir / "gateway.prof"
            with gateway(
                workdir / "profiled", pacing, profile=stats_file, upstream_url=upstream_url
            ) as gw:
                measure(gw, args.profile_streams, args.tokens, 1)
                each = max(1, args.requests // args.profile_streams)
                measure(gw, args.profile_streams, args.tokens, each)
            top = profile_top(stats_file, args.top)
            args.out.mkdir(parents=True, exist_ok=True)
            shutil.copy(stats_file, args.out / f"{stamp}.prof")

    report = {
        "time": stamp,
        "command": " ".join(["python -m tools.gateway_cost", *(argv or sys.argv[1:])]),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_1m": os.getloadavg()[0],
        },
        "settings": {
            "role": args.role,
            "tokens": args.tokens,
            "requests": args.requests,
            "rate": args.rate,
            "stream_interval": args.stream_interval,
            "rounds": args.rounds,
            "reference": args.reference,
            "responses": args.responses,
            "tracing": args.tracing,
            "tracing_requests": args.tracing_requests,
        },
        "idle_us_per_second": idle_us_per_s,
        "spans_received": spans.count if spans is not None else 0,
        "traced_requests": sum(p.result.requests for p in phases if p.kind.startswith("traced")),
        "results": {
            str(n): {name: summary(values) for name, values in row.items() if values}
            for n, row in rows.items()
        },
        "phases": [{**asdict(p), "result": asdict(p.result)} for p in phases],
        "profile_top": top,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{report['time']}.json"
    path.write_text(json.dumps(report, indent=1))
    print(format_table(report))
    if top:
        print(top)
    print(f"written to {path}")
    return 0


def format_table(report: dict[str, Any]) -> str:
    lines = [
        "| streams | CPU per request (us) | of which kernel | CPU per streamed token (us) "
        "| of which kernel | the stand-in engine alone | the gateway's own "
        "| long requests: CPU per token, all in (us) | tokens per event |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def cell(figure: dict[str, float], digits: int) -> str:
        return (
            f"{figure['median']:.{digits}f} ({figure['min']:.{digits}f}-{figure['max']:.{digits}f})"
        )

    front = report["settings"].get("role") == "front"  # no engine in the measured process
    for streams, row in report["results"].items():
        engine = "-" if front else cell(row["engine_token_us"], 1)
        lines.append(
            f"| {streams} | {cell(row['request_us'], 0)} | {cell(row['request_system_us'], 0)} "
            f"| {cell(row['token_us'], 1)} | {cell(row['token_system_us'], 1)} "
            f"| {engine} | {cell(row['own_token_us'], 1)} "
            f"| {cell(row['long_token_us'], 1)} | {cell(row['tokens_per_event'], 2)} |"
        )
    lines += _beside_table(report)
    lines += _tracing_table(report)
    lines += _verdicts(report)
    lines.append(
        f"\nMedian (min-max) of {report['settings']['rounds']} rounds; "
        f"{'front' if front else 'gateway'} idle: {report['idle_us_per_second']:.0f} us CPU "
        "per second."
    )
    return "\n".join(lines)


def _verdicts(report: dict[str, Any]) -> list[str]:
    """The medians at 256 streams against bench/targets.py's gateway-cost targets."""
    row = report["results"].get("256")
    if row is None:
        return []
    limits = GATEWAY_COST_LIMITS[report["settings"]["role"]]
    checks = [
        ("own CPU per token, user space", row["own_token_user_us"], limits["token_us"], "us"),
        ("CPU per request", row["request_us"], limits["request_us"], "us"),
    ]
    if report["settings"].get("reference"):
        ratio = row["all_in_ratio"]
        checks.append(("all in per token / reference", ratio, GATEWAY_COST_ALL_IN_LIMIT, "x"))
    lines = ["", "Targets at 256 streams (bench/targets.py), medians:"]
    for name, figure, limit, unit in checks:
        verdict = "met" if figure["median"] <= limit else "missed"
        lines.append(f"- {name}: {figure['median']:.2f} {unit} (<= {limit:g}): {verdict}")
    return lines


def _tracing_table(report: dict[str, Any]) -> list[str]:
    """Tracing on (full sampling) against off, in the same rounds, where the run asked."""
    if not report["settings"].get("tracing"):
        return []
    lines = [
        "",
        "| streams | traced: CPU per request (us) | tracing's CPU per request (us) "
        "| tracing's CPU per token (us) |",
        "|---:|---:|---:|---:|",
    ]
    for streams, row in report["results"].items():
        cells = [
            f"{row[name]['median']:.{digits}f} "
            f"({row[name]['min']:.{digits}f}-{row[name]['max']:.{digits}f})"
            for name, digits in (
                ("traced_request_us", 0),
                ("tracing_request_us", 1),
                ("tracing_token_us", 2),
            )
        ]
        lines.append(f"| {streams} | {' | '.join(cells)} |")
    lines.append(
        f"\nSpans the receiver decoded: {report['spans_received']}, for "
        f"{report['traced_requests']} traced requests measured (and the warm-up's)."
    )
    return lines


def _beside_table(report: dict[str, Any]) -> list[str]:
    """The gateway's own per token in user space, and the reference's and Responses'
    figures beside the gateway's, where the run measured them."""
    settings = report["settings"]
    lines = [
        "",
        "| streams | the gateway's own per token, user space (us) "
        "| reference: CPU per request (us) | reference: CPU per token (us) "
        "| all in per token: gateway / reference "
        "| Responses: CPU per request (us) | Responses: CPU per token (us) "
        "| Responses / chat: per request | Responses / chat: per token |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def cell(row: dict[str, dict[str, float]], name: str, digits: int, asked: bool) -> str:
        figure = row.get(name)
        if not asked or figure is None:
            return "-"
        return (
            f"{figure['median']:.{digits}f} ({figure['min']:.{digits}f}-{figure['max']:.{digits}f})"
        )

    ref, resp = settings.get("reference", False), settings.get("responses", False)
    for streams, row in report["results"].items():
        lines.append(
            f"| {streams} | {cell(row, 'own_token_user_us', 1, True)} "
            f"| {cell(row, 'reference_request_us', 0, ref)} "
            f"| {cell(row, 'reference_token_us', 1, ref)} "
            f"| {cell(row, 'all_in_ratio', 2, ref)} "
            f"| {cell(row, 'responses_request_us', 0, resp)} "
            f"| {cell(row, 'responses_token_us', 1, resp)} "
            f"| {cell(row, 'responses_request_ratio', 2, resp)} "
            f"| {cell(row, 'responses_token_ratio', 2, resp)} |"
        )
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
