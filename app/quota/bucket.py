"""GCRA in its leaky-bucket form, for the in-process backend; ``lua/common.lua`` mirrors it.

A limit of L per minute is a bucket of capacity L that drains continuously at L per minute. A
request of cost c is admitted when ``level + c <= L``, otherwise it must wait exactly
``(level + c - L) * 60 / L`` seconds: the burst is L and admissions then spread evenly, with no
fixed window. Keeping the level (not GCRA's theoretical arrival time) makes integer costs exact
in floating point, so a burst of exactly L always fits and L + 1 never does.

``drained_us`` is when the bucket was last seen empty. Refunding a reservation's unused cost is
only sound while its charge is still in the level, i.e. the bucket has not emptied since.
"""

from __future__ import annotations

from dataclasses import dataclass

MINUTE_US = 60_000_000
EPSILON = 1e-9


@dataclass
class Bucket:
    level: float
    at_us: int
    drained_us: int


def current(bucket: Bucket | None, limit: int, now_us: int) -> tuple[float, int]:
    """The bucket's level at ``now_us`` and when it was last empty; nothing is stored."""
    if bucket is None:
        return 0.0, now_us
    level = bucket.level - max(0, now_us - bucket.at_us) * limit / MINUTE_US
    if level <= EPSILON:
        return 0.0, now_us
    return level, bucket.drained_us


def wait_seconds(level: float, cost: int, limit: int) -> float:
    """How long until ``cost`` fits under ``limit`` at ``level``; 0 when it fits now."""
    excess = level + cost - limit
    return 0.0 if excess <= EPSILON else excess * 60 / limit
