"""The per-process rate limit of the self-service calls."""

from __future__ import annotations

import pytest

from app.quota import local_limit
from app.quota.local_limit import LocalRateLimit


class Clock:
    def __init__(self) -> None:
        self.us = 0

    def __call__(self) -> int:
        return self.us


def test_a_burst_of_the_limit_then_one_call_per_interval() -> None:
    clock = Clock()
    limit = LocalRateLimit(6, clock_us=clock)
    assert [limit.take("a") for _ in range(6)] == [0.0] * 6
    assert limit.take("a") == pytest.approx(10.0)  # 60 s / 6
    assert limit.take("b") == 0.0  # every subject has its own bucket
    clock.us += 9_000_000
    assert limit.take("a") == pytest.approx(1.0)  # refused calls were not counted
    clock.us += 1_000_000
    assert limit.take("a") == 0.0
    assert limit.take("a") == pytest.approx(10.0)


def test_drained_subjects_are_forgotten_once_many_are_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(local_limit, "FORGET_AFTER", 3)
    clock = Clock()
    limit = LocalRateLimit(60, clock_us=clock)
    for subject in "abc":
        limit.take(subject)
    clock.us += 60_000_000  # every bucket has drained
    limit.take("c")
    limit.take("d")
    assert set(limit._buckets) == {"c", "d"}


def test_a_limit_must_admit_something() -> None:
    with pytest.raises(ValueError, match="positive"):
        LocalRateLimit(0)
