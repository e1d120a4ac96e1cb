"""The issue's targets, each evaluated on the run's samples: met or missed, with the
ratio's interval. A verdict follows the median over rounds; it is *resolved* when
the whole 95% interval lies on the same side of the limit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.config import (
    FLOOD,
    GATEWAY,
    GATEWAY_FCFS,
    ONE_ADAPTER,
    REFERENCE,
    SOLO,
    cliff_point,
    many_adapters_point,
    saturation_point,
)
from bench.stats import (
    ACTIVATIONS_PER_100,
    LOADS_PER_100,
    OUTPUT_TPS,
    TTFT_P99,
    Estimate,
    Figure,
    Sample,
    ratio_estimate,
)

NOISY_LIMIT = 2.0  # B's p99 TTFT under A's flood, at most x B's solo p99 (scheduler on)
THROUGHPUT_LIMIT = 1.0  # many adapters: output tok/s, at least x vLLM's server (same ops)
ACTIVATIONS_LIMIT = 0.7  # many adapters: activations per 100 requests, at most x FCFS's
REGISTERED_LIMIT = 0.75  # 1,000 adapters: tok/s, at least x 1 adapter's
# The cliff: the gateway's TTFT p99 over (multiple x slots) adapters, at most x its p99 over
# as many adapters as slots, at the same offered rate.
CLIFF_LIMITS = {2: 2.0, 8: 4.0}
# make gateway-cost (tools/gateway_cost), 256 streams, stream_interval 1, the median of at
# least 3 rounds: the gateway's own user-space CPU per streamed token (us) and its CPU per
# request (us), by role; and its CPU per token all in, at most x the reference SSE server's.
GATEWAY_COST_LIMITS = {
    "all": {"token_us": 10.0, "request_us": 400.0},
    "front": {"token_us": 15.0, "request_us": 600.0},
}
GATEWAY_COST_ALL_IN_LIMIT = 1.5
GATEWAY_COST = (
    "Gateway cost at 256 streams: in-process <= 10 us of the gateway's own CPU per streamed "
    "token (user space) and <= 400 us per request; front role <= 15 us and <= 600 us; all in, "
    "<= 1.5x the reference SSE server's CPU per token"
)


@dataclass(frozen=True)
class TargetResult:
    name: str
    verdict: str  # met, missed, reported (no limit: FCFS as it is), not measured
    estimate: Estimate | None = None
    detail: str = ""
    limit: float = 0.0

    @property
    def resolved(self) -> bool:
        """The whole interval on the verdict's side, over at least two rounds (one
        round's interval leaves out the drift between rounds)."""
        if self.estimate is None or self.verdict not in ("met", "missed"):
            return False
        measured = sum(r is not None for r in self.estimate.rounds)
        return measured >= 2 and self.estimate.excludes(self.limit)

    def row(self) -> str:
        interval = self.estimate.text() if self.estimate else "-"
        if self.verdict in ("met", "missed"):
            interval += " (resolved)" if self.resolved else " (unresolved)"
        verdict = self.verdict if self.verdict != "missed" else "**missed**"
        return f"| {self.name} | {verdict} | {interval} | {self.detail} |"


def pairs(
    samples: Sequence[Sample], x: tuple[str, str], y: tuple[str, str]
) -> list[tuple[Sample, Sample]]:
    """Round-matched ``(x, y)`` samples, each side named by (system, point)."""
    by_key = {(s.system, s.point, s.round): s for s in samples}
    rounds = sorted({s.round for s in samples})
    return [
        (by_key[(*x, r)], by_key[(*y, r)])
        for r in rounds
        if (*x, r) in by_key and (*y, r) in by_key
    ]


def _judge(
    name: str, figure: Figure, matched: list[tuple[Sample, Sample]], limit: float,
    at_least: bool, seed: int, draws: int, detail: str = "",
) -> TargetResult:  # fmt: skip
    if not matched:
        return TargetResult(name, "not measured", detail=detail or "not in this run's systems")
    estimate = ratio_estimate(figure, matched, seed=seed, draws=draws)
    if estimate.median is None:
        undefined = "no ratio: a side completed nothing, or its figure is zero"
        return TargetResult(name, "missed", estimate, undefined, limit)
    met = estimate.median >= limit if at_least else estimate.median <= limit
    return TargetResult(name, "met" if met else "missed", estimate, detail, limit)


def evaluate(
    samples: Sequence[Sample], concurrencies: Sequence[int], registered: int, seed: int,
    draws: int, cliff: tuple[Sequence[str], int] | None = None,
) -> list[TargetResult]:  # fmt: skip
    """The targets' verdicts; ``cliff``: d's popularities and the engine's slots, when d ran."""
    results = []
    noisy = "Noisy neighbour: B's p99 TTFT under A's flood / B's solo p99"
    results.append(
        _judge(
            f"{noisy}, scheduler (<= {NOISY_LIMIT:g}x)", TTFT_P99,
            pairs(samples, (GATEWAY, FLOOD), (GATEWAY, SOLO)), NOISY_LIMIT, False, seed, draws,
        )
    )  # fmt: skip
    for system in (GATEWAY_FCFS, REFERENCE):
        matched = pairs(samples, (system, FLOOD), (system, SOLO))
        if matched:
            results.append(
                TargetResult(
                    f"{noisy}, FCFS ({system})", "reported",
                    ratio_estimate(TTFT_P99, matched, seed=seed, draws=draws),
                    "no limit: what FCFS gives",
                )
            )  # fmt: skip
    for concurrency in concurrencies:
        point = saturation_point(concurrency)
        results.append(
            _judge(
                f"Many adapters, concurrency {concurrency}: output tok/s gateway / vLLM's "
                f"server with the same ops (>= {THROUGHPUT_LIMIT:g}x)",
                OUTPUT_TPS, pairs(samples, (GATEWAY, point), (REFERENCE, point)),
                THROUGHPUT_LIMIT, True, seed, draws,
            )
        )  # fmt: skip
        against_fcfs = pairs(samples, (GATEWAY, point), (GATEWAY_FCFS, point))
        results.append(
            _judge(
                f"Many adapters, concurrency {concurrency}: adapter activations per 100 "
                f"requests, scheduler / FCFS (<= {ACTIVATIONS_LIMIT:g}x)",
                ACTIVATIONS_PER_100, against_fcfs, ACTIVATIONS_LIMIT, False, seed, draws,
                "needs the gateway with and without its scheduler",
            )
        )  # fmt: skip
        if against_fcfs:
            results.append(
                TargetResult(
                    f"Many adapters, concurrency {concurrency}: adapter loads per 100 "
                    "requests, scheduler / FCFS", "reported",
                    ratio_estimate(LOADS_PER_100, against_fcfs, seed=seed, draws=draws),
                    "no limit: loads follow the host tier's size and the popularity",
                )
            )  # fmt: skip
    many = many_adapters_point(registered)
    matched = pairs(samples, (GATEWAY, many), (GATEWAY, ONE_ADAPTER))
    errors = sum(s.errors for pair in matched for s in pair)
    result = _judge(
        f"{registered or 1000:,} adapters: output tok/s / 1 adapter's (>= {REGISTERED_LIMIT:g}x), "
        "0 errors", OUTPUT_TPS, matched, REGISTERED_LIMIT, True, seed, draws,
        f"errors: {errors}" if matched else "",
    )  # fmt: skip
    if result.verdict == "met" and errors:
        result = TargetResult(result.name, "missed", result.estimate, result.detail, result.limit)
    results.append(result)
    popularities, slots = cliff or ((), 0)
    for popularity in popularities:
        at_slots = (GATEWAY, cliff_point(popularity, slots, slots))
        for multiple, limit in CLIFF_LIMITS.items():
            over = (GATEWAY, cliff_point(popularity, multiple * slots, slots))
            results.append(
                _judge(
                    f"Cliff, {popularity}: TTFT p99 over {multiple}x slots / over adapters = "
                    f"slots, gateway (<= {limit:g}x)",
                    TTFT_P99, pairs(samples, over, at_slots), limit, False, seed, draws,
                )
            )  # fmt: skip
    results.append(
        TargetResult(
            GATEWAY_COST, "not measured",
            detail="not this benchmark: measured without the engine (docs/performance.md)",
        )
    )  # fmt: skip
    return results
