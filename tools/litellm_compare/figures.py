"""The comparison's arithmetic, with no process or socket in it: the loads, the figures of a
measured point, the added latency, the cost of a streamed token, the summary over rounds and
the report's tables."""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.stats import percentile

DIRECT = "upstream alone"  # the client straight to the upstream: the latency nothing adds to
OURS = "lora-gateway front"
LITELLM = "litellm proxy"
SYSTEMS = (OURS, LITELLM)


def load_rates(capacities: Mapping[str, float], fractions: Sequence[float]) -> dict[str, float]:
    """The offered request rates: each fraction of the lower of the systems' capacities
    (requests per second), by its label ("25%")."""
    if not capacities or min(capacities.values()) <= 0:
        raise ValueError("every system needs a capacity above zero")
    if any(not 0 < f <= 1 for f in fractions):
        raise ValueError("loads are fractions of the capacity in (0, 1]")
    lower = min(capacities.values())
    return {load_label(f): f * lower for f in fractions}


def load_label(fraction: float) -> str:
    return f"{fraction:.0%}"


def poisson_arrivals(rate: float, count: int, seed: int) -> list[float]:
    """``count`` arrival times (seconds from the start) of a Poisson process of ``rate``
    per second: the same times for every system given the same seed."""
    if rate <= 0 or count < 1:
        raise ValueError("arrivals need a positive rate and count")
    rng = random.Random(seed)
    times, now = [], 0.0
    for _ in range(count):
        now += rng.expovariate(rate)
        times.append(now)
    return times


@dataclass
class Point:
    """One measured stretch of load on one system: what the client saw and the CPU the
    system's processes spent over it."""

    system: str
    load: str  # "25%", ..., or "max" for a closed loop at saturation
    offered_rate: float | None  # requests/s; None for a closed loop
    requests: int
    errors: int
    wall_seconds: float
    cpu_seconds: float  # user + system, the system's process tree
    system_seconds: float  # of which the kernel's
    latencies: list[float] = field(default_factory=list)  # seconds, per answered request

    @property
    def achieved_rate(self) -> float:
        return (self.requests - self.errors) / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def cpu_per_request_us(self) -> float:
        answered = self.requests - self.errors
        return self.cpu_seconds / answered * 1e6 if answered else float("nan")

    def latency_ms(self, q: float) -> float | None:
        value = percentile(self.latencies, q)
        return None if value is None else value * 1e3


def added_latency_ms(point: Point, direct: Point, q: float) -> float | None:
    """The q-th percentile of ``point``'s latency less that of the upstream alone at the same
    load: what the system in between adds."""
    ours, alone = point.latency_ms(q), direct.latency_ms(q)
    return None if ours is None or alone is None else ours - alone


def per_token_us(short_cpu_per_request_us: float, long_cpu_per_request_us: float,
                 long_tokens: int) -> float:  # fmt: skip
    """The CPU a streamed token adds: a long request's cost beyond a one-token request's,
    over the tokens it streams beyond the first."""
    if long_tokens < 2:
        raise ValueError("a long request streams at least two tokens")
    return (long_cpu_per_request_us - short_cpu_per_request_us) / (long_tokens - 1)


def summary(values: Sequence[float | None]) -> dict[str, float] | None:
    """Median, min and max of the rounds' values (those that exist); None for none."""
    known = [v for v in values if v is not None]
    if not known:
        return None
    return {"median": statistics.median(known), "min": min(known), "max": max(known)}


def point_figures(point: Point, direct: Point | None) -> dict[str, float | None]:
    """The figures a report row holds for one point of one round."""
    return {
        "rate": point.achieved_rate,
        "cpu_per_request_us": point.cpu_per_request_us,
        "p50_ms": point.latency_ms(50),
        "p99_ms": point.latency_ms(99),
        "added_p50_ms": added_latency_ms(point, direct, 50) if direct else None,
        "added_p99_ms": added_latency_ms(point, direct, 99) if direct else None,
        "errors": float(point.errors),
    }


def summarise(rounds: Sequence[Mapping[str, Mapping[str, Mapping[str, float | None]]]]) -> dict[
    str, dict[str, dict[str, dict[str, float] | None]]
]:  # fmt: skip
    """Per system, per load, per figure: the summary over rounds. ``rounds``: each round's
    ``{system: {load: figures}}``."""
    out: dict[str, dict[str, dict[str, dict[str, float] | None]]] = {}
    for system in {s for r in rounds for s in r}:
        loads = {load for r in rounds for load in r.get(system, {})}
        out[system] = {}
        for load in loads:
            names = {n for r in rounds for n in r.get(system, {}).get(load, {})}
            out[system][load] = {
                name: summary([r.get(system, {}).get(load, {}).get(name) for r in rounds])
                for name in sorted(names)
            }
    return out


def _cell(figure: Mapping[str, float] | None, digits: int) -> str:
    if figure is None:
        return "-"
    d = digits
    if figure["min"] == figure["max"]:
        return f"{figure['median']:.{d}f}"
    return f"{figure['median']:.{d}f} ({figure['min']:.{d}f}-{figure['max']:.{d}f})"


def load_order(load: str) -> tuple[int, float]:
    """Loads in rising order, the maximum last."""
    return (1, 0.0) if load == "max" else (0, float(load.rstrip("%")))


def format_report(report: Mapping[str, Any]) -> str:
    """The report's tables (Markdown): per load, each system's figures; then the cost per
    streamed token; then the ratios the targets read."""
    results = report["results"]
    lines = [
        "| load | system | requests/s | CPU per request (us) | p50 (ms) | p99 (ms) "
        "| added p50 (ms) | added p99 (ms) | errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    loads = sorted({load for s in results.values() for load in s}, key=load_order)
    for load in loads:
        for system in (DIRECT, *SYSTEMS):
            row = results.get(system, {}).get(load)
            if row is None:
                continue
            lines.append(
                f"| {load} | {system} | {_cell(row.get('rate'), 0)} "
                f"| {_cell(row.get('cpu_per_request_us'), 0)} | {_cell(row.get('p50_ms'), 2)} "
                f"| {_cell(row.get('p99_ms'), 2)} | {_cell(row.get('added_p50_ms'), 2)} "
                f"| {_cell(row.get('added_p99_ms'), 2)} | {_cell(row.get('errors'), 0)} |"
            )
    tokens = report.get("tokens", {})
    if tokens:
        lines += [
            "",
            "| system | CPU per streamed token (us) | of which kernel |",
            "|---|---:|---:|",
        ]
        for system in SYSTEMS:
            if system in tokens:
                row = tokens[system]
                lines.append(
                    f"| {system} | {_cell(row.get('token_us'), 1)} "
                    f"| {_cell(row.get('token_system_us'), 1)} |"
                )
    ratios = report.get("ratios", {})
    if ratios:
        lines += ["", "| load | our CPU per request / LiteLLM's | our added p99 - LiteLLM's (ms) |",
                  "|---|---:|---:|"]  # fmt: skip
        for load in sorted(ratios, key=load_order):
            row = ratios[load]
            lines.append(
                f"| {load} | {_cell(row.get('cpu_ratio'), 2)} | {_cell(row.get('p99_gap_ms'), 2)} |"
            )
    capacities = report.get("capacities", {})
    if capacities:
        named = ", ".join(f"{s} {c:.0f}" for s, c in capacities.items())
        lines.append(f"\nCapacities at the start (requests/s, max_tokens 1): {named}.")
    rounds = report.get("settings", {}).get("rounds")
    if rounds:
        lines.append(f"Median (min-max) of {rounds} rounds.")
    return "\n".join(lines)


def ratios(rounds: Sequence[Mapping[str, Mapping[str, Mapping[str, float | None]]]]) -> dict[
    str, dict[str, dict[str, float] | None]
]:  # fmt: skip
    """Per load, over rounds: our CPU per request over LiteLLM's, and our added p99 less
    LiteLLM's (negative: ours adds less)."""
    out: dict[str, dict[str, dict[str, float] | None]] = {}
    loads = {load for r in rounds for load in r.get(OURS, {})}
    for load in loads:
        cpu: list[float | None] = []
        gap: list[float | None] = []
        for r in rounds:
            ours, theirs = r.get(OURS, {}).get(load), r.get(LITELLM, {}).get(load)
            if not ours or not theirs:
                continue
            a, b = ours.get("cpu_per_request_us"), theirs.get("cpu_per_request_us")
            cpu.append(a / b if a is not None and b else None)
            x, y = ours.get("added_p99_ms"), theirs.get("added_p99_ms")
            gap.append(x - y if x is not None and y is not None else None)
        out[load] = {"cpu_ratio": summary(cpu), "p99_gap_ms": summary(gap)}
    return out
