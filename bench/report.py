"""The results directory: raw records, summary tables, targets and the plot."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.client import RequestRecord
from bench.stats import FIGURES, Summary, TargetCheck, check_targets, ratios, summarize
from bench.swap_counters import SwapCounters
from bench.workload import WorkloadSpec

OURS = "gateway"
THEIRS = "vllm"
MAIN_POINT = "main"

FIGURE_LABELS = {
    "requests_per_second": "completed req/s",
    "output_tokens_per_second": "output tok/s",
    "ttft_p50": "TTFT p50 (ms)",
    "ttft_p99": "TTFT p99 (ms)",
    "itl_p50": "inter-token p50 (ms)",
    "itl_p99": "inter-token p99 (ms)",
    "e2e_p50": "end-to-end p50 (ms)",
    "e2e_p99": "end-to-end p99 (ms)",
}


@dataclass
class PointRun:
    """One system running one workload point once."""

    system: str
    point: str
    round: int
    spec: WorkloadSpec
    records: list[RequestRecord]
    wall_seconds: float
    residency: SwapCounters | None = None


@dataclass
class PointResult:
    """One workload point over all rounds: per system, its records pooled."""

    point: str
    spec: WorkloadSpec
    summaries: dict[str, Summary] = field(default_factory=dict)
    residency: SwapCounters | None = None
    round_throughput_ratios: list[float] = field(default_factory=list)

    @property
    def ratios(self) -> dict[str, float | None]:
        if OURS in self.summaries and THEIRS in self.summaries:
            return ratios(self.summaries[OURS], self.summaries[THEIRS])
        return {}

    def targets(self) -> list[TargetCheck]:
        if OURS in self.summaries and THEIRS in self.summaries:
            return check_targets(self.summaries[OURS], self.summaries[THEIRS])
        return []


def aggregate(runs: Sequence[PointRun]) -> dict[str, PointResult]:
    """Pool each point's runs per system (throughput over the summed wall time)."""
    results: dict[str, PointResult] = {}
    for point in dict.fromkeys(run.point for run in runs):
        mine = [run for run in runs if run.point == point]
        result = PointResult(point, mine[0].spec)
        for system in dict.fromkeys(run.system for run in mine):
            theirs = [run for run in mine if run.system == system]
            records = [record for run in theirs for record in run.records]
            result.summaries[system] = summarize(records, sum(r.wall_seconds for r in theirs))
            for run in theirs:
                if run.residency is not None:
                    result.residency = (
                        run.residency
                        if result.residency is None
                        else result.residency + run.residency
                    )
        for round_ in sorted({run.round for run in mine}):
            pair = {run.system: run for run in mine if run.round == round_}
            if OURS in pair and THEIRS in pair:
                a = summarize(pair[OURS].records, pair[OURS].wall_seconds)
                b = summarize(pair[THEIRS].records, pair[THEIRS].wall_seconds)
                if b.output_tokens_per_second:
                    result.round_throughput_ratios.append(
                        a.output_tokens_per_second / b.output_tokens_per_second
                    )
        results[point] = result
    return results


def _value(summary: Summary, name: str) -> str:
    value = getattr(summary, name)
    if value is None:
        return "-"
    return (
        f"{value * 1000:.1f}"
        if name not in ("requests_per_second", "output_tokens_per_second")
        else f"{value:.2f}"
    )


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def figures_table(result: PointResult) -> list[str]:
    ours, theirs = result.summaries.get(OURS), result.summaries.get(THEIRS)
    lines = ["| figure | gateway (ours) | vLLM server | ours / vLLM |", "|---|---:|---:|---:|"]
    for name in FIGURES:
        lines.append(
            f"| {FIGURE_LABELS[name]} | {_value(ours, name) if ours else '-'} | "
            f"{_value(theirs, name) if theirs else '-'} | {_ratio(result.ratios.get(name))} |"
        )
    for label, attr in (
        ("requests (completed / errors)", None),
        ("mean prompt tokens", "mean_prompt_tokens"),
        ("mean output tokens", "mean_output_tokens"),
    ):
        cells = []
        for summary in (ours, theirs):
            if summary is None:
                cells.append("-")
            elif attr is None:
                cells.append(f"{summary.requests} ({summary.completed} / {summary.errors})")
            else:
                value = getattr(summary, attr)
                cells.append("-" if value is None else f"{value:.1f}")
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | |")
    return lines


def residency_table(results: dict[str, PointResult]) -> list[str]:
    lines = [
        "| point | uses device / host / storage | device hit rate "
        "| loads (mean / p99 ms) | activations (mean / p99 ms) |",
        "|---|---|---:|---|---|",
    ]
    for result in results.values():
        if result.residency is None:
            continue
        r = result.residency.to_json()
        uses = r["uses"]
        hit = "-" if r["device_hit_rate"] is None else f"{r['device_hit_rate']:.1%}"
        stages = [
            f"{int(r['swaps'][s])} "
            f"({_ms(r['swap_mean_seconds'][s])} / {_ms(r['swap_p99_seconds'][s])})"
            for s in ("load", "activate")
        ]
        lines.append(
            f"| {result.point} "
            f"| {int(uses['device'])} / {int(uses['host'])} / {int(uses['storage'])} "
            f"| {hit} | {stages[0]} | {stages[1]} |"
        )
    return lines


def sweep_points(
    results: dict[str, PointResult], sweep: Sequence[int]
) -> list[tuple[int, PointResult]]:
    """(adapter count, result) for the sweep, the main point standing in for its own count."""
    out: list[tuple[int, PointResult]] = []
    for count in sweep:
        result = results.get(sweep_point_name(count))
        if (
            result is None
            and results.get(MAIN_POINT)
            and results[MAIN_POINT].spec.adapters == count
        ):
            result = results[MAIN_POINT]
        if result is not None:
            out.append((count, result))
    return out


def sweep_point_name(count: int) -> str:
    return f"adapters={count}"


def sweep_table(results: dict[str, PointResult], sweep: Sequence[int]) -> list[str]:
    lines = [
        "| distinct adapters | tok/s ours | tok/s vLLM | ratio "
        "| TTFT p99 ours (ms) | TTFT p99 vLLM (ms) | ratio | errors ours / vLLM |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for count, result in sweep_points(results, sweep):
        ours, theirs = result.summaries.get(OURS), result.summaries.get(THEIRS)
        if ours is None or theirs is None:
            continue
        r = result.ratios
        lines.append(
            f"| {count} | {ours.output_tokens_per_second:.2f} "
            f"| {theirs.output_tokens_per_second:.2f} "
            f"| {_ratio(r.get('output_tokens_per_second'))} "
            f"| {_ms(ours.ttft_p99)} | {_ms(theirs.ttft_p99)} "
            f"| {_ratio(r.get('ttft_p99'))} | {ours.errors} / {theirs.errors} |"
        )
    return lines


def render_markdown(
    results: dict[str, PointResult],
    sweep: Sequence[int],
    context: dict[str, Any],
    plot_name: str | None,
) -> str:
    main = results[MAIN_POINT]
    spec = main.spec
    lines = [
        "# Benchmark: LoRA Gateway against vLLM's own OpenAI server",
        "",
        f"- command: `{context['command']}`",
        f"- when (UTC): {context['started']}; wall time {context['wall_seconds']:.0f} s; "
        f"machine: {context['machine']}",
        f"- engine (both systems): {context['engine']}",
        f"- main workload: {spec.rate:g} req/s Poisson for {spec.duration:g} s, "
        f"{spec.adapters} adapters (Zipf {spec.zipf:g}), {spec.base_share:.0%} base-model "
        f"requests, {spec.output_tokens} output tokens (greedy, streamed), seed {spec.seed}; "
        f"{context['rounds']} round(s), systems alternating "
        f"(run order {' -> '.join(context['order'])}); each system warmed up first "
        "(one base request, then every adapter once)",
        "",
        "## Main workload",
        "",
        *figures_table(main),
        "",
        "Per-round output tok/s ratios (ours / vLLM): "
        + (", ".join(f"{r:.3f}" for r in main.round_throughput_ratios) or "-"),
        "",
        "## Targets (main workload)",
        "",
        "| target | result | |",
        "|---|---|---|",
        *(
            f"| {t.name} | {'met' if t.met else '**missed**'} | {t.detail} |"
            for t in main.targets()
        ),
        "",
        "## Adapter-count sweep (same offered load)",
        "",
        "Each point: "
        + ", ".join(
            f"{count} adapters {r.spec.duration:g} s" for count, r in sweep_points(results, sweep)
        )
        + f" of arrivals at {spec.rate:g} req/s (the main workload stands in for its own count).",
        "",
        *sweep_table(results, sweep),
        "",
        "## Adapter residency in our gateway (from its /metrics, per point, all rounds)",
        "",
        *residency_table(results),
        "",
    ]
    if plot_name:
        lines += [f"![latency, throughput and adapter sweep]({plot_name})", ""]
    return "\n".join(lines)


def summary_json(results: dict[str, PointResult], context: dict[str, Any]) -> dict[str, Any]:
    return {
        "context": context,
        "points": {
            name: {
                "spec": asdict(result.spec),
                "summaries": {s: v.to_json() for s, v in result.summaries.items()},
                "ratios": result.ratios,
                "round_output_tokens_per_second_ratios": result.round_throughput_ratios,
                "targets": [asdict(t) for t in result.targets()],
                "gateway_residency": result.residency.to_json() if result.residency else None,
            }
            for name, result in results.items()
        },
    }


def write_requests(path: Path, runs: Sequence[PointRun]) -> None:
    with path.open("w") as out:
        for run in runs:
            for record in run.records:
                out.write(json.dumps({"round": run.round, **record.to_json()}) + "\n")


def plot(path: Path, results: dict[str, PointResult], sweep: Sequence[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    main = results[MAIN_POINT]
    systems = [s for s in (OURS, THEIRS) if s in main.summaries]
    labels = {OURS: "gateway (ours)", THEIRS: "vLLM server"}
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))

    latency = ["ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "e2e_p50", "e2e_p99"]
    width = 0.8 / max(len(systems), 1)
    ax = axes[0][0]
    for i, system in enumerate(systems):
        values = [(getattr(main.summaries[system], n) or 0) * 1000 for n in latency]
        ax.bar([x + i * width for x in range(len(latency))], values, width, label=labels[system])
    ax.set_xticks([x + width * (len(systems) - 1) / 2 for x in range(len(latency))])
    ax.set_xticklabels([n.replace("_", " ") for n in latency])
    ax.set_yscale("log")
    ax.set_ylabel("ms (log)")
    ax.set_title("Latency percentiles, main workload")
    ax.legend()

    ax = axes[0][1]
    values = [main.summaries[s].output_tokens_per_second for s in systems]
    bars = ax.bar([labels[s] for s in systems], values, color=["C0", "C1"][: len(systems)])
    for bar, system in zip(bars, systems, strict=True):
        ax.annotate(
            f"{main.summaries[system].requests_per_second:.2f} req/s",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
        )
    ax.set_ylabel("output tokens/s")
    ax.set_title("Throughput, main workload")

    points = sweep_points(results, sweep)
    for ax, figure, title, scale in (
        (axes[1][0], "output_tokens_per_second", "Throughput vs distinct adapters", 1.0),
        (axes[1][1], "ttft_p99", "p99 TTFT vs distinct adapters", 1000.0),
    ):
        for system in systems:
            xs = [n for n, r in points if system in r.summaries]
            ys = [
                (getattr(r.summaries[system], figure) or 0) * scale
                for _, r in points
                if system in r.summaries
            ]
            ax.plot(xs, ys, marker="o", label=labels[system])
        ax.set_xscale("log", base=2)
        ax.set_xticks([n for n, _ in points])
        ax.set_xticklabels([str(n) for n, _ in points])
        ax.set_ylim(bottom=0)  # differences to scale, not magnified
        ax.set_xlabel("distinct adapters")
        ax.set_ylabel("output tokens/s" if scale == 1.0 else "ms")
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
