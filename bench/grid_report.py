"""Scenario (e)'s targets and report: on every point of the grid, the gateway against vLLM's
server with the same ops, round by round.

- goodput at least vLLM's server's;
- where vLLM's server meets both objectives for :data:`ATTAINED` of its requests, output tok/s
  at least :data:`THROUGHPUT_LIMIT` and TPOT p50 at most :data:`TPOT_LIMIT` of its own: no slot
  change that no objective needed;
- the cold-start cliff's limits (:data:`bench.targets.CLIFF_LIMITS`), on the gateway: TTFT p99
  over 2x and 8x the slots against over as many adapters as slots, same targets and load.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from bench.config import GATEWAY, VLLM
from bench.grid import GridPoint, Load
from bench.stats import (
    ATTAINMENT,
    ENGINE_STEPS,
    ENGINE_TOKENS,
    FIRST_TOKEN_TURNS,
    GOODPUT,
    HEADROOM_SEATS,
    OUTPUT_TPS,
    REQUESTS_PS,
    SLO_TPOT,
    SLO_TTFT,
    TPOT_P50,
    TPOT_P99,
    TTFT_P50,
    TTFT_P99,
    TURN_LEAD,
    TURNS,
    Figure,
    Sample,
    median_of_rounds,
    ratio_estimate,
)
from bench.swap_counters import histogram_quantile
from bench.targets import CLIFF_LIMITS, TargetResult, judge, pairs

GOODPUT_LIMIT = 1.0
THROUGHPUT_LIMIT = 0.98
TPOT_LIMIT = 1.05
ATTAINED = 0.99


def _of(samples: Sequence[Sample], system: str, name: str) -> list[Sample]:
    return [s for s in samples if s.system == system and s.point == name]


def evaluate_grid(
    samples: Sequence[Sample], points: Sequence[GridPoint], slots: int, seed: int, draws: int
) -> list[TargetResult]:
    results = []
    for point in points:
        name = point.name(slots)
        matched = pairs(samples, (GATEWAY, name), (VLLM, name))
        results.append(
            judge(
                f"{name}: goodput, gateway / vLLM (>= {GOODPUT_LIMIT:g}x)", GOODPUT, matched,
                GOODPUT_LIMIT, True, seed, draws,
            )
        )  # fmt: skip
        attained = median_of_rounds(ATTAINMENT, _of(samples, VLLM, name))
        if attained is not None and attained >= ATTAINED:
            detail = f"vLLM met both objectives for {attained:.1%}"
            results.append(
                judge(
                    f"{name}: output tok/s, gateway / vLLM (>= {THROUGHPUT_LIMIT:g}x)",
                    OUTPUT_TPS, matched, THROUGHPUT_LIMIT, True, seed, draws, detail,
                )
            )  # fmt: skip
            results.append(
                judge(
                    f"{name}: TPOT p50, gateway / vLLM (<= {TPOT_LIMIT:g}x)",
                    TPOT_P50, matched, TPOT_LIMIT, False, seed, draws, detail,
                )
            )  # fmt: skip
        limit = CLIFF_LIMITS.get(point.multiple)
        if limit is not None:
            at_slots = point.reference.name(slots)
            results.append(
                judge(
                    f"{name}: TTFT p99 / at 1x, gateway (<= {limit:g}x)", TTFT_P99,
                    pairs(samples, (GATEWAY, name), (GATEWAY, at_slots)), limit, False, seed,
                    draws,
                )
            )  # fmt: skip
    return results


COLUMNS: tuple[tuple[str, Figure], ...] = (
    ("output tok/s", OUTPUT_TPS),
    ("TPOT p50 (ms)", TPOT_P50),
    ("TPOT p99 (ms)", TPOT_P99),
    ("TTFT p50 (ms)", TTFT_P50),
    ("TTFT p99 (ms)", TTFT_P99),
    ("goodput (req/s)", GOODPUT),
    ("within objectives", ATTAINMENT),
)


def _figure(figure: Figure, samples: Sequence[Sample]) -> str:
    value = median_of_rounds(figure, samples)
    return "-" if value is None else f"{value * figure.scale:.{figure.digits}f}"


def _median_count(samples: Sequence[Sample], counter: str) -> str:
    counts = [s.counters[counter] for s in samples if counter in s.counters]
    return "-" if not counts else f"{sorted(counts)[len(counts) // 2]:.0f}"


def _turns(samples: Sequence[Sample]) -> str:
    """The median turns, with those for a first token only where any was."""
    turns = _median_count(samples, TURNS)
    first = _median_count(samples, FIRST_TOKEN_TURNS)
    return turns if first in ("-", "0") else f"{turns} ({first} first token)"


def _engine_steps(samples: Sequence[Sample]) -> tuple[str, str]:
    """The engine's tokens a step and the run's wall time a step (in a closed loop, where the
    engine never idles, its step time), median over rounds: a system that delivers less
    either runs smaller batches or slower steps."""
    stepped = [s for s in samples if s.counters.get(ENGINE_STEPS)]
    if not stepped:
        return "-", "-"
    tokens = statistics.median(
        s.counters[ENGINE_TOKENS] / s.counters[ENGINE_STEPS] for s in stepped
    )
    seconds = statistics.median(s.wall_seconds / s.counters[ENGINE_STEPS] for s in stepped)
    return f"{tokens:.1f}", f"{seconds * 1000:.0f}"


def _objectives(samples: Sequence[Sample]) -> str:
    known = [s for s in samples if SLO_TTFT in s.counters]
    if not known:
        return "-"
    ttft = sorted(s.counters[SLO_TTFT] for s in known)[len(known) // 2]
    tpot = sorted(s.counters[SLO_TPOT] for s in known)[len(known) // 2]
    return f"TTFT {ttft * 1000:.0f} ms, TPOT {tpot * 1000:.1f} ms"


def turn_lead(samples: Sequence[Sample]) -> str:
    """The steps the gateway's turns took to deliver their request's next token, over every
    point: what the turns' lead (``TURN_LEAD_STEPS``) must cover."""
    buckets: dict[float, float] = {}
    for sample in samples:
        for key, count in sample.counters.items():
            if key.startswith(TURN_LEAD):
                bound = float(key.removeprefix(TURN_LEAD))
                buckets[bound] = buckets.get(bound, 0.0) + count
    turns = max(buckets.values(), default=0.0)
    if not turns:
        return "no slot turn delivered a token"
    p50, p99 = (histogram_quantile(buckets, q) for q in (0.5, 0.99))
    return (
        f"{turns:.0f} turns delivered their request's next token {p50:.1f} steps after they "
        f"were taken at p50, {p99:.1f} at p99 (Prometheus' interpolation within buckets)"
    )


def offered_load(
    samples: Sequence[Sample], point: GridPoint, slots: int, saturation: Load
) -> float | None:
    """An open loop's offered requests per second over the most the same point delivered in
    the closed loop at ``saturation`` (the higher of the two systems), median over rounds.
    Past 1 the open loop's queue grows over the run, and its TTFT p99 with it, in whatever
    order the requests are served: a cliff no scheduler can hold within its limits."""
    reference = GridPoint(point.targets, "uniform", 1, saturation).name(slots)
    closed = dataclasses.replace(point, load=saturation).name(slots)
    ratios = []
    for round_ in sorted({s.round for s in samples}):
        rates = [REQUESTS_PS.of(s) for s in _of(samples, VLLM, reference) if s.round == round_]
        delivered = [
            rate
            for s in samples
            if s.point == closed and s.round == round_ and (rate := REQUESTS_PS.of(s))
        ]
        if rates and rates[0] and delivered:
            ratios.append(point.load.share * rates[0] / max(delivered))
    return statistics.median(ratios) if ratios else None


def _offered_loads(
    samples: Sequence[Sample], members: Sequence[GridPoint], slots: int, saturation: Load
) -> str:
    loads = []
    for point in members:
        ratio = offered_load(samples, point, slots, saturation)
        label = point.name(slots).split(", ", 1)[1].split(" (", 1)[0]  # "uniform 8x"
        loads.append(f"{label} {'-' if ratio is None else f'{ratio:.2f}'}")
    return ", ".join(loads)


def render_grid(
    samples: Sequence[Sample],
    points: Sequence[GridPoint],
    slots: int,
    targets: Sequence[TargetResult],
    context: dict[str, Any],
    seed: int,
    draws: int,
) -> str:
    met = sum(t.verdict == "met" for t in targets)
    missed = [t for t in targets if t.verdict == "missed"]
    lines = [
        "# Scenario (e): slot turns by objectives, on a grid",
        "",
        f"{met} of {len(targets)} targets met, {len(missed)} missed "
        f"({sum(t.verdict == 'not measured' for t in targets)} not measured).",
        "",
        f"- command: `{context['command']}`",
        f"- machine: {context['machine']}; engine: {context['engine']}",
        f"- rounds: {context['rounds']}, both systems up for each, every point run by both "
        f"back to back: vLLM's server first at a 1x point (it fixes the group's objectives: "
        f"5x its TTFT p50 and 1.5x its TPOT p50, per adapter target and load), first at "
        f"every other point elsewhere; wall time {context['wall_seconds']} s"
        + (f" (resumed: {context['resumed']})" if context.get("resumed", "no") != "no" else ""),
        "- figures: median over rounds; ratios: gateway / vLLM, median of the per-round ratios "
        "with a 95% bootstrap interval (rounds, then requests); each engine's tokens a step and "
        "the run's wall time a step from its `vllm:iteration_tokens_total` (in a closed loop, "
        "its step time)",
        f"- the gateway's slot turns: {turn_lead([s for s in samples if s.system == GATEWAY])}",
        "",
    ]
    groups = list(dict.fromkeys(p.group for p in points))
    closed = [p.load for p in points if p.load.closed]
    saturation = max(closed) if closed else None  # Load orders by concurrency
    for group in groups:
        members = [p for p in points if p.group == group]
        reference = members[0].reference.name(slots)
        lines += [
            f"## {group[0]} adapters, {group[1].name}",
            "",
            f"Objectives: {_objectives(_of(samples, VLLM, reference))} (median over rounds).",
            "",
        ]
        if not group[1].closed and saturation is not None:
            lines += [
                f"Offered load over the most each point delivered at {saturation.name} (the "
                "higher system, median over rounds; past 1 the queue grows over the run): "
                + _offered_loads(samples, members, slots, saturation)
                + ".",
                "",
            ]
        lines += [
            "| point | system | "
            + " | ".join(c for c, _ in COLUMNS)
            + " | slot turns | headroom seats | tokens a step | ms a step |",
            "|---|---|" + "---:|" * (len(COLUMNS) + 4),
        ]
        for point in members:
            name = point.name(slots)
            label = name.split(", ", 1)[1].rsplit(", ", 1)[0]
            for system in (VLLM, GATEWAY):
                mine = _of(samples, system, name)
                cells = [
                    *(_figure(f, mine) for _, f in COLUMNS),
                    _turns(mine),
                    _median_count(mine, HEADROOM_SEATS),
                    *_engine_steps(mine),
                ]
                lines.append(f"| {label} | {system} | " + " | ".join(cells) + " |")
            matched = pairs(samples, (GATEWAY, name), (VLLM, name))
            ratios = [
                ratio_estimate(f, matched, seed=seed, draws=draws).text(2) if matched else "-"
                for _, f in COLUMNS
            ]
            lines.append(f"| {label} | ratio | " + " | ".join(ratios) + " | | | | |")
        lines.append("")
    lines += ["## Targets", "", "| target | verdict | ratio [95%] | detail |", "|---|---|---|---|"]
    lines += [t.row() for t in targets]
    return "\n".join(lines) + "\n"
