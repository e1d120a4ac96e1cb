"""From per-request records to the figures the report compares."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench.client import RequestRecord

# What "no meaningful cost over vLLM" means, checked on the main workload point
# (docs/performance.md, "The gateway against vLLM's own server").
THROUGHPUT_RATIO_TARGET = 0.97  # ours / vLLM output tokens per second, at least
TTFT_P50_RATIO_TARGET = 1.05  # ours <= 1.05 x vLLM's p50 TTFT ...
TTFT_P50_SLACK_SECONDS = 0.002  # ... + 2 ms


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100), interpolated linearly between order statistics
    (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Summary:
    requests: int
    completed: int
    errors: int
    wall_seconds: float
    requests_per_second: float
    output_tokens_per_second: float
    ttft_p50: float | None
    ttft_p99: float | None
    itl_p50: float | None
    itl_p99: float | None
    e2e_p50: float | None
    e2e_p99: float | None
    mean_output_tokens: float | None
    mean_prompt_tokens: float | None
    start_lag_p99: float | None  # how late the client itself sent requests

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# The figures compared between systems, with whether higher is better.
FIGURES: dict[str, bool] = {
    "requests_per_second": True,
    "output_tokens_per_second": True,
    "ttft_p50": False,
    "ttft_p99": False,
    "itl_p50": False,
    "itl_p99": False,
    "e2e_p50": False,
    "e2e_p99": False,
}


def summarize(records: Sequence[RequestRecord], wall_seconds: float) -> Summary:
    """Figures of one or more runs of a workload point (``wall_seconds`` summed over runs)."""
    ok = [r for r in records if r.ok]
    gaps = [gap for r in ok for gap in r.itl]
    prompt_tokens = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    wall = max(wall_seconds, 1e-9)
    return Summary(
        requests=len(records),
        completed=len(ok),
        errors=len(records) - len(ok),
        wall_seconds=wall_seconds,
        requests_per_second=len(ok) / wall,
        output_tokens_per_second=sum(r.output_tokens for r in ok) / wall,
        ttft_p50=percentile([r.ttft for r in ok if r.ttft is not None], 50),
        ttft_p99=percentile([r.ttft for r in ok if r.ttft is not None], 99),
        itl_p50=percentile(gaps, 50),
        itl_p99=percentile(gaps, 99),
        e2e_p50=percentile([r.e2e for r in ok if r.e2e is not None], 50),
        e2e_p99=percentile([r.e2e for r in ok if r.e2e is not None], 99),
        mean_output_tokens=sum(r.output_tokens for r in ok) / len(ok) if ok else None,
        mean_prompt_tokens=sum(prompt_tokens) / len(prompt_tokens) if prompt_tokens else None,
        start_lag_p99=percentile([r.started - r.scheduled for r in records], 99),
    )


def ratios(ours: Summary, theirs: Summary) -> dict[str, float | None]:
    """ours / vLLM for every compared figure (None where either is missing or zero)."""
    out: dict[str, float | None] = {}
    for name in FIGURES:
        a, b = getattr(ours, name), getattr(theirs, name)
        out[name] = a / b if a is not None and b else None
    return out


@dataclass(frozen=True)
class TargetCheck:
    name: str
    met: bool
    detail: str


def check_targets(ours: Summary, theirs: Summary) -> list[TargetCheck]:
    checks: list[TargetCheck] = []
    tps = (
        ours.output_tokens_per_second / theirs.output_tokens_per_second
        if theirs.output_tokens_per_second
        else 0.0
    )
    checks.append(
        TargetCheck(
            f"output tokens/s ours >= {THROUGHPUT_RATIO_TARGET}x vLLM",
            tps >= THROUGHPUT_RATIO_TARGET,
            f"{tps:.3f}x ({ours.output_tokens_per_second:.1f} vs "
            f"{theirs.output_tokens_per_second:.1f} tok/s)",
        )
    )
    if ours.ttft_p50 is not None and theirs.ttft_p50 is not None:
        limit = TTFT_P50_RATIO_TARGET * theirs.ttft_p50 + TTFT_P50_SLACK_SECONDS
        checks.append(
            TargetCheck(
                f"p50 TTFT ours <= {TTFT_P50_RATIO_TARGET}x vLLM + "
                f"{TTFT_P50_SLACK_SECONDS * 1000:.0f} ms",
                ours.ttft_p50 <= limit,
                f"{ours.ttft_p50 * 1000:.1f} ms vs limit {limit * 1000:.1f} ms "
                f"(vLLM {theirs.ttft_p50 * 1000:.1f} ms)",
            )
        )
    else:
        checks.append(TargetCheck("p50 TTFT", False, "no completed request"))
    checks.append(
        TargetCheck(
            "zero errors on both",
            ours.errors == 0 and theirs.errors == 0,
            f"ours {ours.errors}, vLLM {theirs.errors}",
        )
    )
    return checks
