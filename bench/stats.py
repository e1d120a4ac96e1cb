"""From per-request records to figures, and from rounds to ratios with intervals.

A *sample* is one system's run of one workload point in one round. A figure
(output tok/s, TTFT p99, adapter swaps per 100 requests, ...) is computed per
sample; a comparison pairs the samples of two systems (or two conditions) round
by round, and its estimate is the median over rounds of the per-round ratios.

Its 95% interval is a seeded hierarchical bootstrap: each draw picks rounds
with replacement, then resamples each picked round's requests with
replacement (both sides), recomputes the round's ratio and takes the median
over the picked rounds; the interval is the 2.5th-97.5th percentile of the
draws. Resampling rounds carries the drift between rounds (which dominates a
throughput ratio, where every request generates the same tokens); resampling
requests carries the spread of latency percentiles within a round.
"""

from __future__ import annotations

import itertools
import math
import statistics
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from bench.client import RequestRecord

Array = npt.NDArray[np.float64]
DRAWS = 2000
CONFIDENCE = 0.95


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
class Sample:
    """One system's run of one point in one round."""

    system: str
    point: str
    round: int
    records: tuple[RequestRecord, ...]
    wall_seconds: float
    # Counters read from the system over the run (the gateway's adapter swaps);
    # empty where the system exposes none.
    counters: Mapping[str, float] = field(default_factory=dict)

    @property
    def errors(self) -> int:
        return sum(1 for r in self.records if not r.ok)


def _tpot(record: RequestRecord) -> float | None:
    """Time per output token after the first, as vLLM's bench serve reports it."""
    return sum(record.itl) / len(record.itl) if record.itl else None


@dataclass(frozen=True)
class Figure:
    """A figure of a sample, from one value per request.

    ``per_request`` gives each request's value (None: it does not count, e.g. a
    failed request's latency); ``reduce`` turns a matrix of resampled values
    (draws x requests, NaN for those that do not count) into one figure per draw.
    """

    name: str
    label: str
    higher_is_better: bool
    per_request: Callable[[RequestRecord], float | None]
    reduce: Callable[[Array, Sample], Array]
    scale: float = 1.0  # shown as value * scale (seconds -> ms)
    digits: int = 1
    # Where a request's value depends on its sample (its objectives): used instead of
    # ``per_request``.
    per_request_in: Callable[[RequestRecord, Sample], float | None] | None = None

    def values(self, sample: Sample) -> Array:
        if self.per_request_in is not None:
            of = self.per_request_in
            return np.array(
                [np.nan if (v := of(r, sample)) is None else float(v) for r in sample.records],
                dtype=np.float64,
            )
        return np.array(
            [np.nan if (v := self.per_request(r)) is None else float(v) for r in sample.records],
            dtype=np.float64,
        )

    def of(self, sample: Sample) -> float | None:
        """The figure of the whole sample (no resampling)."""
        if not sample.records:
            return None
        value = float(self.reduce(self.values(sample)[None, :], sample)[0])
        return None if math.isnan(value) else value


def _rate(values: Array, sample: Sample) -> Array:
    rates: Array = np.nansum(values, axis=1) / max(sample.wall_seconds, 1e-9)
    return rates


def _quantile(q: float) -> Callable[[Array, Sample], Array]:
    def reduce(values: Array, sample: Sample) -> Array:
        out = np.full(values.shape[0], np.nan)
        counted = ~np.isnan(values).all(axis=1)
        if counted.any():
            out[counted] = np.nanpercentile(values[counted], q, axis=1)
        return out

    return reduce


def _per_hundred(counter: str) -> Callable[[Array, Sample], Array]:
    """``counter`` per 100 completed requests (each completed request counts 1)."""

    def reduce(values: Array, sample: Sample) -> Array:
        if counter not in sample.counters:
            return np.full(values.shape[0], np.nan)
        completed = np.nansum(values, axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(completed > 0, 100.0 * sample.counters[counter] / completed, np.nan)

    return reduce


def _per_event(seconds: str, events: str) -> Callable[[Array, Sample], Array]:
    """``seconds`` over ``events``, both counters of the sample (a resample of its requests
    keeps them: they are the sample's, not the requests')."""

    def reduce(values: Array, sample: Sample) -> Array:
        count = sample.counters.get(events, 0.0)
        if seconds not in sample.counters or count <= 0:
            return np.full(values.shape[0], np.nan)
        return np.full(values.shape[0], sample.counters[seconds] / count)

    return reduce


# The engine's steps as the client sees them: the tokens of all streams that arrive within
# STEP_GAP_SHARE of the median gap between a stream's tokens (about one step) come from one
# step. A step that completes no token (it only computes prompts, or paused requests again)
# is not seen. Counted over the middle of a point (STEP_WINDOW of its time, without its ramp
# and drain), where output tok/s is steps per second x tokens per step.
STEP_GAP_SHARE = 0.25
STEP_WINDOW = (0.1, 0.8)


def token_times(record: RequestRecord) -> list[float]:
    """When each of a completed request's tokens reached the client."""
    if not record.ok or record.ttft is None:
        return []
    times = [record.started + record.ttft]
    for gap in record.itl:
        times.append(times[-1] + gap)
    return times


def seen_steps(records: Sequence[RequestRecord]) -> tuple[int, int, float]:
    """(steps, tokens, seconds) the client saw over the middle of a point's run."""
    gaps = [gap for r in records if r.ok for gap in r.itl]
    times = sorted(t for r in records for t in token_times(r))
    if not gaps or not times:
        return 0, 0, 0.0
    start, end = (times[-1] * share for share in STEP_WINDOW)
    seen = [t for t in times if start <= t < end]
    apart = STEP_GAP_SHARE * statistics.median(gaps)
    steps = sum(1 for before, t in itertools.pairwise([-math.inf, *seen]) if t - before > apart)
    return steps, len(seen), end - start


def _of_steps(value: Callable[[int, int, float], float]) -> Callable[[Array, Sample], Array]:
    """A figure of the sample's steps (a resample of its requests keeps them)."""

    def reduce(values: Array, sample: Sample) -> Array:
        steps, tokens, seconds = seen_steps(sample.records)
        return np.full(values.shape[0], value(steps, tokens, seconds) if steps else np.nan)

    return reduce


# Counters a system reports over a sample (the gateway's residency metrics; vLLM's server
# counts none of these but the requests paused): adapter loads into the host tier and
# activations into a device slot, the engine-step seconds each took, and the requests paused
# (parked, or preempted).
LOADS = "adapter_loads"
ACTIVATIONS = "adapter_activations"
LOAD_SECONDS = "adapter_load_seconds"
ACTIVATION_SECONDS = "adapter_activation_seconds"
PREEMPTIONS = "preempted_requests"
TURNS = "slot_turns"
FIRST_TOKEN_TURNS = "first_token_turns"  # of the turns, those for a first token only
# Seats the engine took back for requests let in through the fair front's headroom.
HEADROOM_SEATS = "headroom_seats"
# The turns' lead in steps, by histogram bucket: TURN_LEAD + upper bound -> cumulative count.
TURN_LEAD = "turn_lead_steps_le_"
# What the engine computed, which every system with vLLM's metrics reports: tokens (prompts
# and outputs) and steps.
ENGINE_TOKENS = "engine_tokens"
ENGINE_STEPS = "engine_steps"

OUTPUT_TPS = Figure(
    "output_tps", "output tok/s", True,
    lambda r: float(r.output_tokens) if r.ok else 0.0, _rate, digits=2,
)  # fmt: skip
REQUESTS_PS = Figure(
    "requests_ps", "completed req/s", True, lambda r: 1.0 if r.ok else 0.0, _rate, digits=3
)
TTFT_P50 = Figure("ttft_p50", "TTFT p50 (ms)", False, lambda r: r.ttft if r.ok else None,
                  _quantile(50), scale=1000.0)  # fmt: skip
TTFT_P99 = Figure("ttft_p99", "TTFT p99 (ms)", False, lambda r: r.ttft if r.ok else None,
                  _quantile(99), scale=1000.0)  # fmt: skip
TPOT_P50 = Figure("tpot_p50", "TPOT p50 (ms)", False, lambda r: _tpot(r) if r.ok else None,
                  _quantile(50), scale=1000.0)  # fmt: skip
TPOT_P99 = Figure("tpot_p99", "TPOT p99 (ms)", False, lambda r: _tpot(r) if r.ok else None,
                  _quantile(99), scale=1000.0)  # fmt: skip
E2E_P50 = Figure("e2e_p50", "end-to-end p50 (ms)", False, lambda r: r.e2e if r.ok else None,
                 _quantile(50), scale=1000.0)  # fmt: skip
E2E_P99 = Figure("e2e_p99", "end-to-end p99 (ms)", False, lambda r: r.e2e if r.ok else None,
                 _quantile(99), scale=1000.0)  # fmt: skip
# A paused stream's client sees its tokens stop: the longest gap between two of them.
LONGEST_GAP_P99 = Figure(
    "longest_gap_p99", "longest gap between tokens p99 (ms)", False,
    lambda r: max(r.itl) if r.ok and r.itl else None, _quantile(99), scale=1000.0,
)  # fmt: skip
LOADS_PER_100 = Figure(
    "loads_per_100", "adapter loads per 100 requests", False,
    lambda r: 1.0 if r.ok else None, _per_hundred(LOADS),
)  # fmt: skip
ACTIVATIONS_PER_100 = Figure(
    "activations_per_100", "adapter activations per 100 requests", False,
    lambda r: 1.0 if r.ok else None, _per_hundred(ACTIVATIONS),
)  # fmt: skip
LOAD_MS = Figure(
    "load_ms", "engine time per adapter load (ms)", False,
    lambda r: 1.0 if r.ok else None, _per_event(LOAD_SECONDS, LOADS), scale=1000.0,
)  # fmt: skip
ACTIVATION_MS = Figure(
    "activation_ms", "engine time per adapter activation (ms)", False,
    lambda r: 1.0 if r.ok else None, _per_event(ACTIVATION_SECONDS, ACTIVATIONS), scale=1000.0,
)  # fmt: skip
PAUSES_PER_100 = Figure(
    "pauses_per_100", "requests paused per 100 requests", False,
    lambda r: 1.0 if r.ok else None, _per_hundred(PREEMPTIONS),
)  # fmt: skip
SWAP_FIGURES = (LOADS_PER_100, ACTIVATIONS_PER_100, LOAD_MS, ACTIVATION_MS, PAUSES_PER_100)
STEP_MS = Figure(
    "step_ms", "engine step, as the client sees it (ms)", False,
    lambda r: 1.0 if r.ok else None, _of_steps(lambda steps, _, seconds: seconds / steps),
    scale=1000.0,
)  # fmt: skip
TOKENS_PER_STEP = Figure(
    "tokens_per_step", "tokens per engine step, as the client sees it", True,
    lambda r: 1.0 if r.ok else None, _of_steps(lambda steps, tokens, _: tokens / steps),
)  # fmt: skip

# Scenario (f), batches: what an interactive load leaves of the engine, in the batch's own
# output tok/s: the batch alone's output tok/s x (1 - the load's output tok/s / (a)'s output
# tok/s at saturation), both counters of the load's sample. Where the batch's lines are (a)'s
# requests, the batch alone runs at (a)'s saturation and this is the issue's "batch-alone tok/s
# minus interactive tok/s"; with lines shorter than (a)'s it keeps the engine's share.
BATCH_ALONE_TPS = "batch_alone_output_tps"
SATURATION_TPS = "saturation_output_tps"


def _capacity_left(values: Array, sample: Sample) -> Array:
    """The capacity a load's sample leaves (above); a sample without both counters: its
    own output tok/s, so that one figure serves both sides of the batch's share."""
    rates = _rate(values, sample)
    alone, saturated = sample.counters.get(BATCH_ALONE_TPS), sample.counters.get(SATURATION_TPS)
    if alone is None or not saturated:
        return rates
    left: Array = alone * (1.0 - rates / saturated)
    return left


BATCH_SHARE_TPS = Figure(
    "batch_share_tps", "output tok/s (a batch's, or the capacity a load leaves it)", True,
    lambda r: float(r.output_tokens) if r.ok else 0.0, _capacity_left, digits=2,
)  # fmt: skip

# A sample's latency objectives (scenario e), in seconds: counters, as they are the sample's.
SLO_TTFT = "slo_ttft_seconds"
SLO_TPOT = "slo_tpot_seconds"


def met_objectives(record: RequestRecord, sample: Sample) -> float | None:
    """1 where ``record`` completed within both of ``sample``'s objectives, else 0; None where
    the sample has none."""
    ttft, tpot = sample.counters.get(SLO_TTFT), sample.counters.get(SLO_TPOT)
    if ttft is None or tpot is None:
        return None
    if not record.ok or record.ttft is None or record.ttft > ttft:
        return 0.0
    per_token = _tpot(record)
    return 0.0 if per_token is not None and per_token > tpot else 1.0


def _share(values: Array, sample: Sample) -> Array:
    with warnings.catch_warnings():  # a sample with no objectives: NaN, not a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        shares: Array = np.nanmean(values, axis=1)
    return shares


# DistServe's goodput: requests per second that met both objectives.
GOODPUT = Figure(
    "goodput", "goodput (req/s within both objectives)", True,
    lambda r: None, _rate, digits=3, per_request_in=met_objectives,
)  # fmt: skip
ATTAINMENT = Figure(
    "attainment", "requests within both objectives (share)", True,
    lambda r: None, _share, digits=3, per_request_in=met_objectives,
)  # fmt: skip

THROUGHPUT_FIGURES = (
    OUTPUT_TPS, REQUESTS_PS, TTFT_P50, TTFT_P99, TPOT_P50, TPOT_P99, E2E_P99,
    STEP_MS, TOKENS_PER_STEP,
)  # fmt: skip
LATENCY_FIGURES = (OUTPUT_TPS, TTFT_P50, TTFT_P99, TPOT_P50, E2E_P50, E2E_P99)


def median_of_rounds(figure: Figure, samples: Sequence[Sample]) -> float | None:
    values = [v for s in samples if (v := figure.of(s)) is not None]
    return statistics.median(values) if values else None


@dataclass(frozen=True)
class Estimate:
    """A ratio: the median over rounds, its bootstrap interval, the rounds' own."""

    median: float | None
    low: float | None
    high: float | None
    rounds: tuple[float | None, ...]

    def excludes(self, limit: float) -> bool:
        """True when the whole interval lies on one side of ``limit``."""
        if self.low is None or self.high is None:
            return False
        return self.high < limit or self.low > limit

    def text(self, digits: int = 3) -> str:
        if self.median is None:
            return "-"
        if self.low is None or self.high is None:
            return f"{self.median:.{digits}f}"
        return f"{self.median:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def _resampled(figure: Figure, sample: Sample, rng: np.random.Generator, draws: int) -> Array:
    values = figure.values(sample)
    if values.size == 0:
        return np.full(draws, np.nan)
    picks = rng.integers(0, values.size, size=(draws, values.size))
    return figure.reduce(values[picks], sample)


def ratio_estimate(
    figure: Figure,
    pairs: Sequence[tuple[Sample, Sample]],
    *,
    seed: int,
    draws: int = DRAWS,
    confidence: float = CONFIDENCE,
) -> Estimate:
    """``figure(x) / figure(y)`` over rounds of ``(x, y)`` pairs: median and interval."""
    per_round: list[float | None] = []
    for x, y in pairs:
        a, b = figure.of(x), figure.of(y)
        per_round.append(a / b if a is not None and b else None)
    known = [r for r in per_round if r is not None]
    if not known:
        return Estimate(None, None, None, tuple(per_round))
    rng = np.random.default_rng(seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.stack(
            [
                _resampled(figure, x, rng, draws) / _resampled(figure, y, rng, draws)
                for x, y in pairs
            ]
        )  # rounds x draws
    ratios[~np.isfinite(ratios)] = np.nan
    picks = rng.integers(0, len(pairs), size=(draws, len(pairs)))
    drawn = ratios[picks, np.arange(draws)[:, None]]  # draws x picked rounds
    usable = ~np.isnan(drawn).all(axis=1)
    if not usable.any():
        return Estimate(statistics.median(known), None, None, tuple(per_round))
    medians = np.nanmedian(drawn[usable], axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(medians, [tail, 100 - tail])
    return Estimate(statistics.median(known), float(low), float(high), tuple(per_round))


def interleaved(systems: Sequence[str], rounds: int) -> list[tuple[int, str]]:
    """The run order: every system once per round, in the same order (A B C A B C ...),
    so a drift over the run weighs on every system alike."""
    if rounds < 1 or not systems:
        raise ValueError("at least one round of at least one system")
    if len(set(systems)) != len(systems):
        raise ValueError("a system is listed twice")
    return [(round_, system) for round_ in range(rounds) for system in systems]
