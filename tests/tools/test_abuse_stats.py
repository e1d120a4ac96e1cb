"""The abuse suite's figures: the target, the ratio and its interval, and what a failed victim
request counts for."""

from __future__ import annotations

import pytest

from tools.abuse.stats import Round, ratio, summarize, target_seconds
from tools.abuse.victim import VictimRequest


def requests(*seconds: float, outcome: str = "200") -> list[VictimRequest]:
    return [VictimRequest(s, outcome, 0.001, "200") for s in seconds]


def test_the_target_is_twice_the_p99_alone_or_half_a_second_more_whichever_is_larger() -> None:
    assert target_seconds(0.01) == pytest.approx(0.51)
    assert target_seconds(0.5) == pytest.approx(1.0)
    assert target_seconds(2.0) == pytest.approx(4.0)


def test_a_round_meets_the_target_when_its_p99_under_attack_is_within_it() -> None:
    solo = requests(*[0.010] * 50)
    assert Round(solo, requests(*[0.010] * 49, 0.500)).meets_target
    assert not Round(solo, requests(*[0.010] * 48, 0.600, 0.600)).meets_target
    assert not Round(solo, []).meets_target


def test_a_failed_victim_request_counts_with_the_time_it_took_and_fails_the_row() -> None:
    solo = requests(*[0.010] * 50)
    # Refused fast: its latency alone would look fine, but the row does not pass.
    refused = requests(*[0.010] * 49) + requests(0.002, outcome="503")
    summary = summarize("row", [Round(solo, refused)])
    assert summary.rounds_meeting_target == 1
    assert summary.victim_failures_attacked == 1
    assert summary.victim_failure_kinds == {"503": 1}
    assert not summary.passed
    # A timeout counts as the timeout: a lower bound of what the victim waited.
    timed_out = requests(*[0.010] * 48) + requests(30.0, 30.0, outcome="timeout")
    late = summarize("row", [Round(solo, timed_out)])
    assert late.attacked_p99 == pytest.approx(30.0)
    assert late.rounds_meeting_target == 0


def test_the_ratio_is_the_median_over_rounds_with_an_interval_around_it() -> None:
    rounds = [
        Round(requests(*[0.010 + i * 1e-4 for i in range(50)]), requests(*[0.030] * 50)),
        Round(requests(*[0.010] * 50), requests(*[0.020 + i * 2e-4 for i in range(50)])),
        Round(requests(*[0.010] * 50), requests(*[0.025] * 50)),
    ]
    estimate = ratio("row", rounds)
    per_round = [r.attacked_p99 / r.solo_p99 for r in rounds]  # type: ignore[operator]
    assert estimate.rounds == pytest.approx(per_round)
    assert estimate.median == pytest.approx(sorted(per_round)[1])
    assert estimate.low is not None and estimate.high is not None
    assert estimate.median is not None
    assert estimate.low <= estimate.median <= estimate.high
    assert min(per_round) * 0.9 <= estimate.low and estimate.high <= max(per_round) * 1.1


def test_a_summary_adds_up_the_attackers_outcomes_and_the_victims_requests() -> None:
    rounds = [
        Round(requests(0.01, 0.01), requests(0.02, 0.02), {"429": 10, "400": 1}, 11, 1.0),
        Round(requests(0.01, 0.01), requests(0.02, 0.02), {"429": 5}, 5, -1.0),
    ]
    summary = summarize("row", rounds)
    assert summary.attacker == {"429": 15, "400": 1}
    assert summary.attacker_attempts == 16
    assert (summary.solo_requests, summary.attacked_requests) == (4, 4)
    assert summary.unsettled_rounds == 1
    assert summary.passed
    assert summary.to_json()["ratio"]["median"] == pytest.approx(2.0)
