"""A requests-per-minute limit kept in this process only, for calls too cheap to share one
(a tenant reading its own usage and limits): each replica admits up to the limit."""

from __future__ import annotations

import time
from collections.abc import Callable

from app.quota.bucket import Bucket, current, wait_seconds

FORGET_AFTER = 10_000
"""Subjects held before those whose bucket has drained are forgotten."""


class LocalRateLimit:
    """``per_minute`` calls per subject, with the in-memory backend's leaky bucket (a burst
    of ``per_minute``, then evenly spread)."""

    def __init__(
        self, per_minute: int, *, clock_us: Callable[[], int] = lambda: time.monotonic_ns() // 1000
    ) -> None:
        if per_minute < 1:
            raise ValueError("per_minute must be positive")
        self.per_minute = per_minute
        self._clock_us = clock_us
        self._buckets: dict[str, Bucket] = {}

    def take(self, subject: str) -> float:
        """Count one call of ``subject`` and return 0, or return how many seconds it must
        wait (a refused call is not counted)."""
        now = self._clock_us()
        level, drained = current(self._buckets.get(subject), self.per_minute, now)
        wait = wait_seconds(level, 1, self.per_minute)
        if wait == 0:
            if len(self._buckets) >= FORGET_AFTER:
                self._forget_drained(now)
            self._buckets[subject] = Bucket(level + 1, now, drained)
        return wait

    def _forget_drained(self, now: int) -> None:
        self._buckets = {
            subject: bucket
            for subject, bucket in self._buckets.items()
            if current(bucket, self.per_minute, now)[0] > 0
        }
