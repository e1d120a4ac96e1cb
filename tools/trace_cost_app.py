"""Tracing's CPU per request in the whole gateway app, in one process:
``python -m tools.trace_cost_app [--streams 256] [--requests 2048] [--rounds 5]``.

The gateway app (:mod:`tools.gateway_cost.in_process`'s: over its paced engine, called as an
ASGI app with no server and no client) serves a phase of chat requests (``max_tokens`` 1)
with tracing off, then one with tracing on at full sampling (``tracing.install``: the same
app, its traces exported over OTLP/HTTP by :class:`app.tracing.export.OtlpExport` to a
receiver on loopback), each round. Each phase reads the CPU time of the event loop's thread
and of the export thread (their own clocks: the receiver's threads in this process are not
counted). Tracing's cost is the traced phase's, both threads, less the untraced phase's loop.

Each phase also counts the garbage collector's work (``gc.callbacks``): its CPU time, in
whichever thread a collection ran, the collections of each generation and the objects they
freed (garbage in reference cycles, which only a collection frees), per request.

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
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

from app import tracing
from app.tracing import export
from app.tracing.setup import sinks_for
from tools.gateway_cost import in_process
from tools.gateway_cost.spans import span_sink, tracing_env

SETTLE_SECONDS = 0.3
"""After a phase, the time its last requests get to settle, inside the measured window."""


class Collections:
    """The garbage collector's work while :meth:`counting`, by generation: the CPU seconds of
    its collections (each timed in the thread that ran it) and how many; and the objects they
    found unreachable."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.runs = [0, 0, 0]
        self.freed = 0
        self._began = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.thread_time()
            return
        generation = info["generation"]
        self.seconds[generation] += time.thread_time() - self._began
        self.runs[generation] += 1
        self.freed += info["collected"]

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
        f"{sum(collections.seconds) / requests * 1e6:.1f} us ({each}, gen 0/1/2), "
        f"{collections.freed / requests:.1f} objects freed"
    )


async def measure(args: argparse.Namespace, url: str, workdir: Path) -> dict[str, float]:
    provider = TracerProvider()
    sinks = sinks_for(tracing_env(url), provider)
    (sink,) = sinks
    assert isinstance(sink, export.OtlpExport)
    exporter = sink.thread
    rows: list[tuple[float, float, float]] = []
    try:
        async with in_process.gateway(workdir, args.rate) as app:
            key, model = await in_process._set_up(app)
            path, body = in_process._body("chat", model, 1)
            call = (in_process._scope(path, key, body), body)
            each = max(1, args.requests // args.streams)
            for traced in (sinks, None):  # warm up, both ways
                tracing.install(provider if traced else None, traced or ())
                await _phase(app, call, args.streams, max(1, each // 4), exporter)
            gc.collect()
            gc.freeze()  # as the server does once the engine has started
            for number in range(args.rounds):
                tracing.install(None)
                off, _, off_gc = await _phase(app, call, args.streams, each, exporter)
                tracing.install(provider, sinks)
                on, exported, on_gc = await _phase(app, call, args.streams, each, exporter)
                tracing.install(None)
                rows.append((on - off, exported, on + exported - off))
                print(
                    f"round {number + 1}: loop {off * 1e6:.0f} us untraced, {on * 1e6:.0f} "
                    f"traced; export thread {exported * 1e6:.1f}; tracing "
                    f"{rows[-1][2] * 1e6:.1f} us a request",
                    flush=True,
                )
                requests = args.streams * each
                print(
                    f"  the collector, a request: untraced {_collected(off_gc, requests)}; "
                    f"traced {_collected(on_gc, requests)}",
                    flush=True,
                )
    finally:
        tracing.install(None)
        sink.shutdown()
    names = ("loop", "export_thread", "tracing")
    return {name: statistics.median(row[n] for row in rows) * 1e6 for n, name in enumerate(names)}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--requests", type=int, default=2048, help="requests per phase")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rate", type=float, default=20_000, help="the engine's tokens/s")
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="trace-cost-") as workdir,
        span_sink() as receiver,
        open(os.devnull, "w") as quiet,
        contextlib.redirect_stderr(quiet),  # the access log's lines, as a server's would go
    ):
        medians = asyncio.run(measure(args, receiver.url, Path(workdir)))
        spans = receiver.count
    print(
        f"tracing on against off, {args.streams} streams, median of {args.rounds} rounds of "
        f"{args.streams * max(1, args.requests // args.streams)} requests, CPU per request: "
        f"the loop +{medians['loop']:.1f} us, the export thread {medians['export_thread']:.1f}"
        f" us, in all {medians['tracing']:.1f} us ({spans} spans received)"
    )
    return {**medians, "spans": spans}


if __name__ == "__main__":
    main()
