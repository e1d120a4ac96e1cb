"""From the victim's requests to a row's figures: p99 alone and under attack, their ratio
with a 95% interval over rounds, and the issue's target.

The target (issue #23), per round: the victim's p99 under attack at most
``max(2 x its solo p99, solo p99 + 0.5 s)``. A row passes when every round meets it and no
victim request failed under attack.

A failed victim request counts in the p99 with the time it took to fail (a timeout with the
timeout: a lower bound), so that a gateway that refuses the victim quickly does not look
fast; failures are shown apart too. The ratio's interval is :mod:`bench.stats`'s
hierarchical bootstrap (rounds resampled, then each round's requests).
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.client import RequestRecord
from bench.stats import Array, Estimate, Figure, Sample, percentile, ratio_estimate
from tools.abuse.victim import VictimRequest

TARGET_FACTOR = 2.0
TARGET_SLACK_SECONDS = 0.5


def target_seconds(solo_p99: float) -> float:
    """The most the victim's p99 under attack may be, given its p99 alone."""
    return max(TARGET_FACTOR * solo_p99, solo_p99 + TARGET_SLACK_SECONDS)


def p99(values: list[float]) -> float | None:
    return percentile(values, 99)


@dataclass
class Round:
    """One round of a row: the victim alone, then under attack; what the attacker got."""

    solo: list[VictimRequest]
    attacked: list[VictimRequest]
    attacker: dict[str, int] = field(default_factory=dict)
    attacker_attempts: int = 0
    # Seconds the gateway took to go quiet after the attack (-1: it never did, within the
    # bound): an attack whose work outlives it weighs on the next round's solo phase.
    settle_seconds: float = 0.0

    @property
    def solo_p99(self) -> float | None:
        return p99([r.seconds for r in self.solo])

    @property
    def attacked_p99(self) -> float | None:
        return p99([r.seconds for r in self.attacked])

    @property
    def meets_target(self) -> bool:
        solo, attacked = self.solo_p99, self.attacked_p99
        return solo is not None and attacked is not None and attacked <= target_seconds(solo)


def _p99_of_rows(values: Array, sample: Sample) -> Array:
    """Each resampled row's 99th percentile (numpy interpolates as ``percentile`` does)."""
    result: Array = np.percentile(values, 99, axis=1)
    return result


VICTIM_P99 = Figure("victim_p99", "victim p99 (s)", False, lambda r: r.e2e, _p99_of_rows, digits=3)


def _sample(row: str, number: int, requests: list[VictimRequest], phase: str) -> Sample:
    records = tuple(
        RequestRecord(
            system=phase,
            point=row,
            index=index,
            tenant=0,
            model="",
            scheduled=0.0,
            e2e=request.seconds,
            status=int(request.outcome) if request.outcome.isdigit() else None,
            error=None if request.ok else request.outcome,
        )
        for index, request in enumerate(requests)
    )
    return Sample(phase, row, number, records, wall_seconds=sum(r.seconds for r in requests))


def ratio(row: str, rounds: list[Round], *, seed: int = 23) -> Estimate:
    """Attacked p99 over solo p99: the median over rounds, and its 95% interval."""
    pairs = [
        (_sample(row, n, r.attacked, "attacked"), _sample(row, n, r.solo, "solo"))
        for n, r in enumerate(rounds)
        if r.solo and r.attacked
    ]
    if not pairs:
        return Estimate(None, None, None, ())
    return ratio_estimate(VICTIM_P99, pairs, seed=seed)


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


@dataclass
class RowSummary:
    name: str
    rounds: int
    solo_requests: int
    attacked_requests: int
    solo_p99: float | None
    attacked_p99: float | None
    ratio: Estimate
    rounds_meeting_target: int
    victim_failures_solo: int
    victim_failures_attacked: int
    victim_failure_kinds: dict[str, int]
    healthz_attacked_p99: float | None
    healthz_failures_attacked: int
    attacker: dict[str, int]
    attacker_attempts: int
    unsettled_rounds: int

    @property
    def passed(self) -> bool:
        return (
            self.rounds > 0
            and self.rounds_meeting_target == self.rounds
            and self.victim_failures_attacked == 0
        )

    def to_json(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in self.__dict__.items() if k != "ratio"},
            "ratio": {
                "median": self.ratio.median,
                "low": self.ratio.low,
                "high": self.ratio.high,
                "rounds": list(self.ratio.rounds),
            },
            "target_seconds": None if self.solo_p99 is None else target_seconds(self.solo_p99),
            "passed": self.passed,
        }


def summarize(name: str, rounds: list[Round]) -> RowSummary:
    attacker: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    for r in rounds:
        attacker.update(r.attacker)
        failures.update(v.outcome for v in r.attacked if not v.ok)
    healthz = [v.healthz_seconds for r in rounds for v in r.attacked]
    return RowSummary(
        name=name,
        rounds=len(rounds),
        solo_requests=sum(len(r.solo) for r in rounds),
        attacked_requests=sum(len(r.attacked) for r in rounds),
        solo_p99=_median([r.solo_p99 for r in rounds]),
        attacked_p99=_median([r.attacked_p99 for r in rounds]),
        ratio=ratio(name, rounds),
        rounds_meeting_target=sum(r.meets_target for r in rounds),
        victim_failures_solo=sum(not v.ok for r in rounds for v in r.solo),
        victim_failures_attacked=sum(failures.values()),
        victim_failure_kinds=dict(failures),
        healthz_attacked_p99=p99(healthz),
        healthz_failures_attacked=sum(
            v.healthz_outcome != "200" for r in rounds for v in r.attacked
        ),
        attacker=dict(attacker),
        attacker_attempts=sum(r.attacker_attempts for r in rounds),
        unsettled_rounds=sum(r.settle_seconds < 0 for r in rounds),
    )
