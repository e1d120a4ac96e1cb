"""Tracing's CPU per request in the whole gateway app, in one process:
``python -m tools.trace_cost_app [--streams 256] [--requests 2048] [--rounds 5]``.

The gateway app (:mod:`tools.gateway_cost.in_process`'s: over its paced engine, called as an
ASGI app with no server and no client) serves three phases of chat requests (``max_tokens``
1) each round, in an order that turns from round to round: tracing off; tracing on with a
sampler that samples nothing (the trace context made and handed on, nothing recorded); tracing
on at full sampling (``tracing.install``: the same app, its traces exported over OTLP/HTTP by
:class:`app.tracing.export.OtlpExport` to a receiver in a process of its own). Each phase
reads the CPU time of the event loop's thread and of the export thread (their own clocks).
Tracing's cost is the traced phase's, both threads, less the untraced phase's loop.

Each phase also counts the garbage collector's work (``gc.callbacks``): its CPU time, in
whichever thread a collection ran (and how much of it ran in the export thread), the
collections of each generation and the objects they freed (garbage in reference cycles,
which only a collection frees), per request.

Where :mod:`tools.trace_cost` times tracing's calls alone (the code and its data warm, nothing
between two requests), this times them among the app's own work, with its garbage collector
and caches; and where ``make gateway-cost --tracing`` compares two gateway processes under
one client on a shared machine, this compares one app with itself, phase by phase.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from app import tracing
from app.tracing import export
from app.tracing.setup import sinks_for
from tools.gateway_cost import in_process
from tools.gateway_cost.spans import tracing_env

SETTLE_SECONDS = 0.3
"""After a phase, the time its last requests get to settle, inside the measured window."""
PHASES = ("off", "unsampled", "traced")


class Collections:
    """The garbage collector's work while :meth:`counting`, by generation: the CPU seconds of
    its collections (each timed in the thread that ran it) and how many; and the objects they
    found unreachable. ``elsewhere``: the seconds of those that ran in another thread than
    the one that counts."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.runs = [0, 0, 0]
        self.freed = 0
        self.elsewhere = 0.0
        self._began = 0.0
        self._thread = threading.get_ident()

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.thread_time()
            return
        generation = info["generation"]
        seconds = time.thread_time() - self._began
        self.seconds[generation] += seconds
        self.runs[generation] += 1
        self.freed += info["collected"]
        if threading.get_ident() != self._thread:
            self.elsewhere += seconds

    @contextlib.contextmanager
    def counting(self) -> Iterator[Collections]:
        gc.callbacks.append(self._callback)
        try:
            yield self
        finally:
            gc.callbacks.remove(self._callback)


def _thread_cpu(thread: threading.Thread) -> float:
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


async def _phase(
    app: Any,
    call: tuple[dict[str, Any], bytes],
    streams: int,
    each: int,
    exporter: threading.Thread,
) -> tuple[float, float, Collections]:
    """CPU seconds per request of the loop's thread and of the export thread, and the
    collector's work in the phase."""
    scope, body = call
    with Collections().counting() as collections:
        loop_before, export_before = time.thread_time(), _thread_cpu(exporter)
        await in_process._phase(app, scope, body, streams, each)
        await asyncio.sleep(SETTLE_SECONDS)
        loop, exported = time.thread_time() - loop_before, _thread_cpu(exporter) - export_before
    requests = streams * each
    return loop / requests, exported / requests, collections


def _collected(collections: Collections, requests: int) -> str:
    each = "/".join(
        f"{seconds / requests * 1e6:.1f} us in {runs}"
        for seconds, runs in zip(collections.seconds, collections.runs, strict=True)
    )
    return (
        f"{sum(collections.seconds) / requests * 1e6:.1f} us ({each}, gen 0/1/2; "
        f"{collections.elsewhere / requests * 1e6:.1f} in the export thread), "
        f"{collections.freed / requests:.1f} objects freed"
    )


@contextlib.contextmanager
def _receiver() -> Iterator[tuple[str, list[int]]]:
    """An OTLP/HTTP receiver in a process of its own (its threads take no part in this
    process's interpreter lock or collector): its URL, and the spans it received (once it
    has stopped)."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tools.gateway_cost.spans"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    received: list[int] = []
    try:
        yield child.stdout.readline().strip(), received
    finally:
        child.stdin.close()
        received.append(int(child.stdout.readline() or 0))
        child.wait()


async def measure(args: argparse.Namespace, url: str, workdir: Path) -> dict[str, list[float]]:
    """Per round, in µs a request: what the unsampled phase's loop adds (``unsampled``), what
    the traced phase's adds (``loop``), the export thread's, and tracing's in all."""
    provider = TracerProvider()
    unsampling = TracerProvider(sampler=ALWAYS_OFF)
    sinks = sinks_for(tracing_env(url), provider)
    (sink,) = sinks
    assert isinstance(sink, export.OtlpExport)
    exporter = sink.thread
    ways = {"off": None, "unsampled": unsampling, "traced": provider}
    rows: dict[str, list[float]] = {"unsampled": [], "loop": [], "export_thread": [], "tracing": []}
    try:
        async with in_process.gateway(workdir, args.rate) as app:
            key, model = await in_process._set_up(app)
            path, body = in_process._body("chat", model, 1)
            call = (in_process._scope(path, key, body), body)
            each = max(1, args.requests // args.streams)
            requests = args.streams * each
            for way in ways.values():  # warm up, every way
                tracing.install(way, sinks if way is not None else ())
                await _phase(app, call, args.streams, max(1, each // 4), exporter)
            gc.collect()
            gc.freeze()  # as the server does once the engine has started
            for number in range(args.rounds):
                order = PHASES[number % 3 :] + PHASES[: number % 3]
                read: dict[str, tuple[float, float, Collections]] = {}
                for phase in order:
                    way = ways[phase]
                    tracing.install(way, sinks if way is not None else ())
                    read[phase] = await _phase(app, call, args.streams, each, exporter)
                    tracing.install(None)
                off, unsampled, (on, exported, _) = (
                    read["off"][0],
                    read["unsampled"][0],
                    read["traced"],
                )
                rows["unsampled"].append(unsampled - off)
                rows["loop"].append(on - off)
                rows["export_thread"].append(exported)
                rows["tracing"].append(on + exported - off)
                print(
                    f"round {number + 1} ({', '.join(order)}): loop {off * 1e6:.0f} us "
                    f"untraced, {unsampled * 1e6:.0f} unsampled, {on * 1e6:.0f} traced; "
                    f"export thread {exported * 1e6:.1f}; tracing {rows['tracing'][-1] * 1e6:.1f}"
                    " us a request",
                    flush=True,
                )
                for phase in PHASES:
                    print(
                        f"  the collector, a request, {phase}: "
                        f"{_collected(read[phase][2], requests)}",
                        flush=True,
                    )
    finally:
        tracing.install(None)
        sink.shutdown()
    return {name: [value * 1e6 for value in values] for name, values in rows.items()}


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f} to {max(values):.1f})"


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--requests", type=int, default=2048, help="requests per phase")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rate", type=float, default=20_000, help="the engine's tokens/s")
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="trace-cost-") as workdir,
        _receiver() as (url, received),
        open(os.devnull, "w") as quiet,
        contextlib.redirect_stderr(quiet),  # the access log's lines, as a server's would go
    ):
        rows = asyncio.run(measure(args, url, Path(workdir)))
    print(
        f"tracing on against off, {args.streams} streams, median (min to max) of {args.rounds}"
        f" rounds of {args.streams * max(1, args.requests // args.streams)} requests, CPU per "
        f"request: unsampled +{_spread(rows['unsampled'])} us on the loop; traced: the loop "
        f"+{_spread(rows['loop'])} us, the export thread {_spread(rows['export_thread'])} us, "
        f"in all {_spread(rows['tracing'])} us ({received[0]} spans received)"
    )
    return {
        **{name: statistics.median(values) for name, values in rows.items()},
        "spans": received[0],
    }


if __name__ == "__main__":
    main()
