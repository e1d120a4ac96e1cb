"""The results directory: raw records, the markdown report and its JSON twin.

Every figure is the median over rounds of a system's per-round figure; every
ratio is the median of the per-round ratios with its 95% interval (the seeded
hierarchical bootstrap of ``bench.stats``) in brackets.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.config import (
    CLIFF_POPULARITIES,
    FLOOD,
    GATEWAY,
    ONE_ADAPTER,
    REFERENCE,
    SOLO,
    VLLM_SHIPPED,
    cliff_point,
)
from bench.scenarios import FLOOD_COMPLETED, FLOOD_REFUSED
from bench.stats import (
    E2E_P50,
    LATENCY_FIGURES,
    LOADS,
    LONGEST_GAP_P99,
    OUTPUT_TPS,
    SWAP_FIGURES,
    THROUGHPUT_FIGURES,
    TTFT_P50,
    TTFT_P99,
    Figure,
    Sample,
    median_of_rounds,
    ratio_estimate,
)
from bench.targets import TargetResult, pairs

BOOTSTRAP = (
    "95% intervals: seeded hierarchical bootstrap (rounds resampled with replacement, "
    "then each round's requests), {draws} draws, seed {seed}; a figure is the median over "
    "rounds, a ratio the median of the per-round ratios. With one round an interval "
    "covers only the spread of requests within it (none for throughput, where every "
    "request generates the same tokens); a verdict is resolved when its interval, over "
    "at least two rounds, lies on one side of the limit"
)
SHIPPED_NOTE = (
    "vllm-shipped is vLLM's server as shipped (LORA_GATEWAY_ISOLATION_FIX=0): vLLM's CPU "
    "LoRA ops, including the no-adapter slot bug, so its base-model outputs may be wrong "
    "(docs/isolation.md); its speed is what users get today"
)
SWAP_NOTE = (
    "Adapter loads (storage -> the host tier) and activations (host tier -> a device slot), "
    "and the engine time each took: from the gateway's /metrics "
    "(lora_gateway_adapter_swap_seconds{stage}). Requests paused: vllm:num_preemptions, "
    "the running requests a slot turn (or a full KV cache) paused: parked with their KV "
    "blocks, or preempted and computed again from their last full block when they resume."
)
NOT_COUNTABLE = (
    "vLLM's server counts no adapter loads or activations (its /metrics shows only "
    "vllm:lora_requests_info, the names of the running and waiting adapters)"
)


def _points(samples: Sequence[Sample]) -> list[str]:
    return list(dict.fromkeys(s.point for s in samples))


def _systems(samples: Sequence[Sample]) -> list[str]:
    return list(dict.fromkeys(s.system for s in samples))


def _of(samples: Sequence[Sample], system: str, point: str) -> list[Sample]:
    return [s for s in samples if s.system == system and s.point == point]


def _value(figure: Figure, samples: Sequence[Sample]) -> str:
    value = median_of_rounds(figure, samples)
    return "-" if value is None else f"{value * figure.scale:.{figure.digits}f}"


def _reference(systems: Sequence[str]) -> str:
    return REFERENCE if REFERENCE in systems else systems[0]


def point_table(
    samples: Sequence[Sample], point: str, figures: Sequence[Figure], seed: int, draws: int
) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Every system's figures at ``point`` and each one's ratio to the reference."""
    mine = [s for s in samples if s.point == point]
    systems = _systems(mine)
    reference = _reference(systems)
    others = [s for s in systems if s != reference]
    lines = [
        "| figure | " + " | ".join(systems) + " | "
        + " | ".join(f"{o} / {reference} [95%]" for o in others) + " |",
        "|---|" + "---:|" * (len(systems) + len(others)),
    ]  # fmt: skip
    ratios: dict[str, dict[str, Any]] = {}
    for figure in figures:
        if figure in SWAP_FIGURES and not any(LOADS in s.counters for s in mine):
            continue
        cells = [_value(figure, _of(mine, system, point)) for system in systems]
        for other in others:
            estimate = ratio_estimate(
                figure, pairs(mine, (other, point), (reference, point)), seed=seed, draws=draws
            )
            ratios.setdefault(other, {})[figure.name] = asdict(estimate)
            cells.append(estimate.text())
        lines.append(f"| {figure.label} | " + " | ".join(cells) + " |")
    errors = [
        f"{sum(s.errors for s in _of(mine, system, point))} / "
        f"{sum(len(s.records) for s in _of(mine, system, point))}"
        for system in systems
    ]
    lines.append(
        "| errors / requests (all rounds) | " + " | ".join(errors) + " |" + " |" * len(others)
    )
    return lines, ratios


def noisy_table(samples: Sequence[Sample], seed: int, draws: int) -> list[str]:
    lines = [
        "| system | B's TTFT p50 alone (ms) | p99 alone | p50 under A's flood | p99 under flood "
        "| p99 flood / alone [95%] | A's requests completed / refused (429) | errors (B) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for system in _systems(samples):
        solo, flood = _of(samples, system, SOLO), _of(samples, system, FLOOD)
        if not solo or not flood:
            continue
        estimate = ratio_estimate(
            TTFT_P99, pairs(samples, (system, FLOOD), (system, SOLO)), seed=seed, draws=draws
        )
        completed = sum(s.counters.get(FLOOD_COMPLETED, 0.0) for s in flood)
        refused = sum(s.counters.get(FLOOD_REFUSED, 0.0) for s in flood)
        errors = sum(s.errors for s in solo + flood)
        lines.append(
            f"| {system} | {_value(TTFT_P50, solo)} | {_value(TTFT_P99, solo)} "
            f"| {_value(TTFT_P50, flood)} | {_value(TTFT_P99, flood)} | {estimate.text()} "
            f"| {completed:.0f} / {refused:.0f} | {errors} |"
        )
    return lines


def registered_table(samples: Sequence[Sample], point: str, seed: int, draws: int) -> list[str]:
    one, many = _of(samples, GATEWAY, ONE_ADAPTER), _of(samples, GATEWAY, point)
    if not one or not many:
        return []
    estimate = ratio_estimate(
        OUTPUT_TPS, pairs(samples, (GATEWAY, point), (GATEWAY, ONE_ADAPTER)), seed=seed, draws=draws
    )
    swaps = SWAP_FIGURES if any(LOADS in s.counters for s in one + many) else ()
    lines = [
        "| traffic | output tok/s | TTFT p99 (ms) | "
        + "".join(f"{f.label} | " for f in swaps) + "errors / requests |",
        "|---|---:|---:|" + "---:|" * len(swaps) + "---:|",
    ]  # fmt: skip
    for name, group in ((ONE_ADAPTER, one), (point, many)):
        lines.append(
            f"| {name} | {_value(OUTPUT_TPS, group)} | {_value(TTFT_P99, group)} | "
            + "".join(f"{_value(f, group)} | " for f in swaps)
            + f"{sum(s.errors for s in group)} / {sum(len(s.records) for s in group)} |"
        )
    lines.append(f"| ratio (many / one) [95%] | {estimate.text()} |" + " |" * (len(swaps) + 2))
    return lines


def cliff_table(samples: Sequence[Sample], slots: int, seed: int, draws: int) -> list[str]:
    """(d): per popularity and adapter count, every system's TTFT, end-to-end p50, longest
    gap between a stream's tokens and output tok/s, and the gateway's TTFT p99 against its
    own over as many adapters as slots."""
    points = [p for p in _points(samples) if p.startswith("d: ")]
    systems = _systems([s for s in samples if s.point in points])
    lines = [
        "| point | " + " | ".join(
            f"{n}: TTFT p50 / p99 (ms) | {n}: end-to-end p50 (ms) | {n}: longest gap p99 (ms) "
            f"| {n}: output tok/s" for n in systems
        ) + f" | {GATEWAY}: p99 / p99 at slots [95%] |",
        "|---|" + "---:|---:|---:|---:|" * len(systems) + "---:|",
    ]  # fmt: skip
    for point in points:
        cells = [
            f"{_value(TTFT_P50, group)} / {_value(TTFT_P99, group)} | {_value(E2E_P50, group)} "
            f"| {_value(LONGEST_GAP_P99, group)} | {_value(OUTPUT_TPS, group)}"
            for group in (_of(samples, system, point) for system in systems)
        ]
        ratio = ""
        for popularity in CLIFF_POPULARITIES:
            if point.startswith(f"d: {popularity}, "):
                at_slots = (GATEWAY, cliff_point(popularity, slots, slots))
                matched = pairs(samples, (GATEWAY, point), at_slots)
                ratio = ratio_estimate(TTFT_P99, matched, seed=seed, draws=draws).text()
        lines.append(f"| {point} | " + " | ".join(cells) + f" | {ratio} |")
    errors = [f"{sum(s.errors for s in samples if s.system == n and s.point in points)}"
              for n in systems]  # fmt: skip
    lines.append("| errors | " + "".join(f"{e} | | | | " for e in errors) + " |")
    return lines


def render_markdown(
    samples: Sequence[Sample],
    targets: Sequence[TargetResult],
    context: dict[str, Any],
    registered_point: str | None,
) -> tuple[str, dict[str, Any]]:
    """The report, and the ratios it shows (for the JSON)."""
    seed, draws = context["seed"], context["draws"]
    systems = _systems(samples)
    lines = [
        "# Benchmark: the gateway against vLLM's server",
        "",
        f"- command: `{context['command']}`",
        f"- when (UTC): {context['started']}; wall time {context['wall_seconds']:.0f} s; "
        f"machine: {context['machine']}",
        f"- engine (every system): {context['engine']}",
        f"- systems: {', '.join(context['systems'])}; {context['rounds']} round(s), "
        f"interleaved (run order {' -> '.join(context['order'])})"
        + (
            f"; scenario c on the gateway alone, after them, max_loras "
            f"{context['registered_max_loras']}"
            if registered_point
            else ""
        ),
        f"- workload (a): {context['workload']}",
        *(
            [f"- gateway settings: {', '.join(f'LORA_GATEWAY_{s}' for s in settings)}"]
            if (settings := context.get("gateway_settings"))
            else []
        ),
        f"- {BOOTSTRAP.format(draws=draws, seed=seed)}",
        "- TTFT is the time to the first chunk with generated text (not the role chunk); "
        "TPOT the mean gap between a request's later tokens",
    ]
    if context.get("curve_rates"):
        rates = ", ".join(f"{f:.0%}: {r:.3f} req/s" for f, r in context["curve_rates"].items())
        lines.append(f"- open-loop rates (share of the first saturation measured): {rates}")
    if VLLM_SHIPPED in systems:
        lines.append(f"- {SHIPPED_NOTE}")
    ratios: dict[str, Any] = {}
    for point in _points(samples):
        if point in (SOLO, FLOOD, ONE_ADAPTER, registered_point) or point.startswith("d: "):
            continue
        figures = (*THROUGHPUT_FIGURES, *SWAP_FIGURES) if "saturation" in point else LATENCY_FIGURES
        table, ratios[point] = point_table(samples, point, figures, seed, draws)
        lines += ["", f"## {point}", "", *table]
        if "saturation" in point and any(LOADS in s.counters for s in samples if s.point == point):
            lines += ["", f"{SWAP_NOTE} {NOT_COUNTABLE}."]
    if any(s.point == SOLO for s in samples):
        lines += [
            "", "## b: noisy neighbour", "",
            f"Tenant A keeps {context['flood_streams']} streams open (each replaced when it ends); "
            "tenant B sends one request at a time, alone and then once A's streams flow.",
            "", *noisy_table(samples, seed, draws),
        ]  # fmt: skip
    if registered_point:
        lines += ["", f"## {registered_point} against 1 adapter (the gateway only)", ""]
        lines += registered_table(samples, registered_point, seed, draws)
    if context.get("cliff_rates"):
        rates = ", ".join(
            f"round {r + 1}: {rate:.3f} req/s" for r, rate in context["cliff_rates"].items()
        )
        lines += [
            "", "## d: the cold-start cliff", "",
            f"{context['cliff']}; offered rates: {rates}.", "",
            *cliff_table(samples, context["config"]["max_loras"], seed, draws),
        ]  # fmt: skip
    lines += [
        "", "## Targets", "",
        "| target | verdict | ratio [95%] | |", "|---|---|---|---|",
        *(t.row() for t in targets), "",
    ]  # fmt: skip
    return "\n".join(lines), ratios


def summary_json(
    samples: Sequence[Sample],
    targets: Sequence[TargetResult],
    context: dict[str, Any],
    ratios: dict[str, Any],
) -> dict[str, Any]:
    figures = {f.name: f for f in (*THROUGHPUT_FIGURES, *LATENCY_FIGURES, *SWAP_FIGURES)}
    return {
        "context": context,
        "samples": [
            {
                "system": s.system,
                "point": s.point,
                "round": s.round,
                "wall_seconds": s.wall_seconds,
                "requests": len(s.records),
                "errors": s.errors,
                "counters": dict(s.counters),
                "figures": {name: f.of(s) for name, f in figures.items()},
            }
            for s in samples
        ],
        "ratios": ratios,
        "targets": [{**asdict(t), "resolved": t.resolved} for t in targets],
    }


def write_requests(path: Path, samples: Sequence[Sample]) -> None:
    with path.open("w") as out:
        for sample in samples:
            for record in sample.records:
                out.write(json.dumps({"round": sample.round, **record.to_json()}) + "\n")
