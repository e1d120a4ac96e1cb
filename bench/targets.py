"""The issue's targets, each evaluated on the run's samples: met or missed, with the
ratio's interval. A verdict follows the median over rounds; it is *resolved* when
the whole 95% interval lies on the same side of the limit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.config import (
    BATCH_ALONE,
    BATCH_BESIDE,
    BATCH_ONLINE,
    CAPACITY_LEFT,
    FLOOD,
    GATEWAY,
    GATEWAY_FCFS,
    INTERACTIVE_WITH,
    INTERACTIVE_WITHOUT,
    ONE_ADAPTER,
    REFERENCE,
    SOLO,
    cliff_point,
    many_adapters_point,
    saturation_point,
)
from bench.stats import (
    ACTIVATIONS_PER_100,
    BATCH_SHARE_TPS,
    LOADS_PER_100,
    OUTPUT_TPS,
    TPOT_P50,
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
# Batches (f): the interactive load's TTFT p99 and TPOT p50 with a batch running, at most x
# without; the batch's output tok/s beside it, at least x the capacity the load leaves; a
# batch alone, at least x the output tok/s of its lines sent online at saturation.
BATCH_TTFT_LIMIT = 1.25
BATCH_TPOT_LIMIT = 1.15
BATCH_SHARE_LIMIT = 0.5
BATCH_ALONE_LIMIT = 0.9
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


def judge(
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
        judge(
            f"{noisy}, scheduler (<= {NOISY_LIMIT:g}x)",
            TTFT_P99,
            pairs(samples, (GATEWAY, FLOOD), (GATEWAY, SOLO)),
            NOISY_LIMIT,
            False,
            seed,
            draws,
        )
    )
    for system in (GATEWAY_FCFS, REFERENCE):
        matched = pairs(samples, (system, FLOOD), (system, SOLO))
        if matched:
            results.append(
                TargetResult(
                    f"{noisy}, FCFS ({system})",
                    "reported",
                    ratio_estimate(TTFT_P99, matched, seed=seed, draws=draws),
                    "no limit: what FCFS gives",
                )
            )
    for concurrency in concurrencies:
        point = saturation_point(concurrency)
        results.append(
            judge(
                f"Many adapters, concurrency {concurrency}: output tok/s gateway / vLLM's "
                f"server with the same ops (>= {THROUGHPUT_LIMIT:g}x)",
                OUTPUT_TPS,
                pairs(samples, (GATEWAY, point), (REFERENCE, point)),
                THROUGHPUT_LIMIT,
                True,
                seed,
                draws,
            )
        )
        against_fcfs = pairs(samples, (GATEWAY, point), (GATEWAY_FCFS, point))
        results.append(
            judge(
                f"Many adapters, concurrency {concurrency}: adapter activations per 100 "
                f"requests, scheduler / FCFS (<= {ACTIVATIONS_LIMIT:g}x)",
                ACTIVATIONS_PER_100,
                against_fcfs,
                ACTIVATIONS_LIMIT,
                False,
                seed,
                draws,
                "needs the gateway with and without its scheduler",
            )
        )
        if against_fcfs:
            results.append(
                TargetResult(
                    f"Many adapters, concurrency {concurrency}: adapter loads per 100 "
                    "requests, scheduler / FCFS",
                    "reported",
                    ratio_estimate(LOADS_PER_100, against_fcfs, seed=seed, draws=draws),
                    "no limit: loads follow the host tier's size and the popularity",
                )
            )
    many = many_adapters_point(registered)
    matched = pairs(samples, (GATEWAY, many), (GATEWAY, ONE_ADAPTER))
    errors = sum(s.errors for pair in matched for s in pair)
    result = judge(
        f"{registered or 1000:,} adapters: output tok/s / 1 adapter's (>= {REGISTERED_LIMIT:g}x), "
        "0 errors",
        OUTPUT_TPS,
        matched,
        REGISTERED_LIMIT,
        True,
        seed,
        draws,
        f"errors: {errors}" if matched else "",
    )
    if result.verdict == "met" and errors:
        result = TargetResult(result.name, "missed", result.estimate, result.detail, result.limit)
    results.append(result)
    popularities, slots = cliff or ((), 0)
    for popularity in popularities:
        at_slots = (GATEWAY, cliff_point(popularity, slots, slots))
        for multiple, limit in CLIFF_LIMITS.items():
            over = (GATEWAY, cliff_point(popularity, multiple * slots, slots))
            results.append(
                judge(
                    f"Cliff, {popularity}: TTFT p99 over {multiple}x slots / over adapters = "
                    f"slots, gateway (<= {limit:g}x)",
                    TTFT_P99,
                    pairs(samples, over, at_slots),
                    limit,
                    False,
                    seed,
                    draws,
                )
            )
    results.append(
        TargetResult(
            GATEWAY_COST,
            "not measured",
            detail="not this benchmark: measured without the engine (docs/performance.md)",
        )
    )
    return results


def evaluate_batches(samples: Sequence[Sample], seed: int, draws: int) -> list[TargetResult]:
    """Scenario (f)'s verdicts, each named by its declared id. A batch line that failed, or
    an interactive request that did, turns a met verdict into missed."""
    batch_errors = sum(s.errors for s in samples if s.point in (BATCH_ALONE, BATCH_BESIDE))
    load_errors = sum(
        s.errors for s in samples if s.point in (INTERACTIVE_WITH, INTERACTIVE_WITHOUT)
    )
    online_errors = sum(s.errors for s in samples if s.point == BATCH_ONLINE)
    checks = (
        ("batches.ttft", TTFT_P99, INTERACTIVE_WITH, INTERACTIVE_WITHOUT, BATCH_TTFT_LIMIT,
         False, load_errors, "interactive TTFT p99, with the batch / without"),
        ("batches.tpot", TPOT_P50, INTERACTIVE_WITH, INTERACTIVE_WITHOUT, BATCH_TPOT_LIMIT,
         False, load_errors, "interactive TPOT p50, with the batch / without"),
        ("batches.share", BATCH_SHARE_TPS, BATCH_BESIDE, CAPACITY_LEFT, BATCH_SHARE_LIMIT,
         True, batch_errors, "the batch's output tok/s beside the load / the capacity it leaves"),
        ("batches.alone", OUTPUT_TPS, BATCH_ALONE, BATCH_ONLINE, BATCH_ALONE_LIMIT, True,
         batch_errors + online_errors, "a batch alone's output tok/s / its lines online"),
    )  # fmt: skip
    results = []
    for name, figure, x, y, limit, at_least, errors, text in checks:
        sign = ">=" if at_least else "<="
        result = judge(
            f"{name}: {text} ({sign} {limit:g}x)", figure,
            pairs(samples, (GATEWAY, x), (GATEWAY, y)), limit, at_least, seed, draws,
            f"errors: {errors}",
        )  # fmt: skip
        if result.verdict == "met" and errors:
            result = TargetResult(result.name, "missed", result.estimate, result.detail, limit)
        results.append(result)
    return results


@dataclass(frozen=True)
class DeclaredTarget:
    """One target of one benchmark, as its issue states it. Each has exactly one row in
    docs/performance.md's targets table, first cell its ``id`` (tests/test_performance_page.py)."""

    id: str
    measured_by: str  # the command (or test) that measures it
    target: str
    issue: int | None = None  # where the target was set, where one issue did


# Every target of every benchmark. An id is stable: a target that changes keeps its id, one
# that is dropped loses its row in docs/performance.md with it.
DECLARED_TARGETS: tuple[DeclaredTarget, ...] = (
    # make bench (bench/config.py's scenarios; evaluate() above judges a run's samples)
    DeclaredTarget(
        "bench.noisy",
        "make bench",
        f"(b) {GATEWAY}: B's TTFT p99 under A's flood / alone <= {NOISY_LIMIT:g}x",
    ),
    DeclaredTarget(
        "bench.a.tps.c16",
        "make bench",
        f"(a) output tok/s, gateway / vLLM's server, concurrency 16 >= {THROUGHPUT_LIMIT:g}x",
    ),
    DeclaredTarget(
        "bench.a.tps.c64", "make bench", f"(a) the same at concurrency 64 >= {THROUGHPUT_LIMIT:g}x"
    ),
    DeclaredTarget(
        "bench.a.activations.c16",
        "make bench",
        f"(a) adapter activations per 100 requests, gateway / gateway-fcfs, concurrency "
        f"16 <= {ACTIVATIONS_LIMIT:g}x",
    ),
    DeclaredTarget(
        "bench.a.activations.c64",
        "make bench",
        f"(a) the same at concurrency 64 <= {ACTIVATIONS_LIMIT:g}x",
    ),
    DeclaredTarget(
        "bench.c.registered",
        "make bench",
        f"(c) 1,000 adapters: output tok/s / 1 adapter's >= {REGISTERED_LIMIT:g}x, 0 errors",
    ),
    DeclaredTarget(
        "bench.d.zipf.2x",
        "make bench",
        f"(d) Zipf: TTFT p99 over 2x the slots / over adapters = slots <= {CLIFF_LIMITS[2]:g}x",
    ),
    DeclaredTarget(
        "bench.d.zipf.8x",
        "make bench",
        f"(d) Zipf: the same over 8x the slots <= {CLIFF_LIMITS[8]:g}x",
    ),
    DeclaredTarget(
        "bench.d.uniform.2x",
        "make bench",
        f"(d) uniform: TTFT p99 over 2x the slots <= {CLIFF_LIMITS[2]:g}x",
    ),
    DeclaredTarget(
        "bench.d.uniform.8x",
        "make bench",
        f"(d) uniform: the same over 8x the slots <= {CLIFF_LIMITS[8]:g}x",
    ),
    DeclaredTarget(
        "bench.round",
        "python -m bench --rounds 1",
        "one default round <= 45 minutes on the 2-core machine",
    ),
    # make bench, scenario (e): the grid of turns by objectives (issue #49)
    DeclaredTarget(
        "bench.e.goodput",
        "make bench-grid",
        "(e) every grid point: goodput (requests meeting both objectives per s) >= vLLM's server's",
        49,
    ),
    DeclaredTarget(
        "bench.e.tps",
        "make bench-grid",
        "(e) where vLLM's server meets both objectives for >= 99% of requests: output "
        "tok/s >= 0.98x its",
        49,
    ),
    DeclaredTarget(
        "bench.e.tpot",
        "make bench-grid",
        "(e) the same points: TPOT p50 <= 1.05x vLLM's server's",
        49,
    ),
    DeclaredTarget(
        "bench.e.cliff",
        "make bench-grid",
        "(e) the grid's 2x and 8x points: TTFT p99 <= 2x and <= 4x its value at one "
        "adapter per slot",
        49,
    ),
    DeclaredTarget(
        "bench.e.round",
        "make bench-grid",
        "(e) the full grid: one round <= 90 minutes at default sizes on the 2-core machine",
        49,
    ),
    DeclaredTarget(
        "bench.e.quick", "make bench-grid-quick", "(e) --quick: one round < 15 minutes", 49
    ),
    # make bench-lora
    DeclaredTarget(
        "lora.decode.3",
        "make bench-lora",
        "decode-heavy, mixed batch over 3 adapters: tok/s >= 0.85x base-only",
    ),
    DeclaredTarget(
        "lora.decode.16", "make bench-lora", "decode-heavy, over 16 adapters: >= 0.75x base-only"
    ),
    DeclaredTarget(
        "lora.prefill.3", "make bench-lora", "prefill-heavy, over 3 adapters: >= 0.85x base-only"
    ),
    DeclaredTarget(
        "lora.prefill.16", "make bench-lora", "prefill-heavy, over 16 adapters: >= 0.75x base-only"
    ),
    # make gateway-cost: the hot path (issue #50), at 256 streams, stream_interval 1
    DeclaredTarget(
        "cost.in-process.token",
        "make gateway-cost",
        "in-process, the gateway's own CPU per streamed token <= 10 us",
        50,
    ),
    DeclaredTarget(
        "cost.in-process.request",
        "make gateway-cost",
        "in-process, the gateway's own CPU per request <= 400 us",
        50,
    ),
    DeclaredTarget(
        "cost.front.token", "make gateway-cost", "front role, CPU per streamed token <= 15 us", 50
    ),
    DeclaredTarget(
        "cost.front.request", "make gateway-cost", "front role, CPU per request <= 600 us", 50
    ),
    DeclaredTarget(
        "cost.reference",
        "make gateway-cost",
        "all-in, within 1.5x of a minimal reference SSE server in the same run",
        50,
    ),
    DeclaredTarget(
        "cost.api-server",
        "make bench-api-cpu",
        "real engine, (a) at saturation: API-server process CPU per output token, gateway "
        "/ vLLM's server <= 1.0x",
        50,
    ),
    DeclaredTarget(
        "cost.litellm.cpu",
        "make litellm-compare",
        "the front's CPU per request <= 0.5x LiteLLM proxy's over the same paced upstream",
        50,
    ),
    DeclaredTarget(
        "cost.litellm.p99",
        "make litellm-compare",
        "the front's p99 added latency < LiteLLM proxy's, at 25%, 50% and 90% of capacity",
        50,
    ),
    # the Responses API (issue #51)
    DeclaredTarget(
        "responses.cost",
        "make gateway-cost",
        "/v1/responses against /v1/chat/completions: CPU per request and per streamed "
        "token <= 1.15x, both roles, 16 and 256 streams",
        51,
    ),
    DeclaredTarget(
        "responses.store",
        "python -m tools.responses_store_bench",
        "store: true over store: false, 64 concurrent requests: <= 5 ms added at p99, "
        "SQLite and PostgreSQL",
        51,
    ),
    # batches (issue #52)
    DeclaredTarget(
        "batches.ttft",
        "make bench-batches",
        "a 2,000-line batch beside (a) at 50%: the interactive tenant's TTFT p99 <= 1.25x "
        "without the batch",
        52,
    ),
    DeclaredTarget(
        "batches.tpot",
        "make bench-batches",
        "the same: the interactive tenant's TPOT p50 <= 1.15x without the batch",
        52,
    ),
    DeclaredTarget(
        "batches.share",
        "make bench-batches",
        "the same: the batch's output tok/s >= 0.5x the capacity the interactive load leaves",
        52,
    ),
    DeclaredTarget(
        "batches.alone",
        "make bench-batches",
        "a batch alone: output tok/s >= 0.9x the same requests online at saturation",
        52,
    ),
    # tracing (issue #53)
    DeclaredTarget(
        "tracing.cost",
        "make gateway-cost",
        "tracing on, full sampling, against off: <= 60 us of CPU per request",
        53,
    ),
    DeclaredTarget(
        "tracing.tokens",
        "the in-memory exporter's test",
        "no span, event or attribute per streamed token: the same span count for 1 and 64 tokens",
        53,
    ),
    DeclaredTarget(
        "tracing.off",
        "make gateway-cost",
        "tracing off, access log at its default: the hot path's targets hold in the same run",
        53,
    ),
    # the rest
    DeclaredTarget(
        "abuse.victim",
        "make abuse",
        "every row: the victim's p99 under attack <= max(2x alone, alone + 0.5 s), no "
        "victim request failing",
        23,
    ),
    DeclaredTarget(
        "shadow.ttft",
        "make bench-shadow",
        "a tenant's TTFT p99, alias shadowed at 100% / no shadow <= 1.1x",
    ),
    DeclaredTarget(
        "rollback.check",
        "python -m tools.rollback_check_bench",
        "a rollback rule's check over 10^6 rows <= 50 ms",
    ),
    DeclaredTarget(
        "rollback.lag",
        "python -m tools.rollback_check_bench",
        "/healthz p99 during checks within 10 ms of idle",
    ),
    DeclaredTarget("tests.all", "make test", "make test <= 12 minutes on the 2-core machine"),
    DeclaredTarget(
        "tests.fast", "make test-fast", "make test-fast <= 2 minutes on the 2-core machine"
    ),
)
