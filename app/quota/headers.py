"""OpenAI's rate-limit response headers."""

from __future__ import annotations

import math
from collections.abc import Sequence

# Float noise (0.3 * 1000 == 300.00000000000006) must not round a wait up by a whole unit.
_NOISE = 1e-6


def format_duration(seconds: float) -> str:
    """A duration as OpenAI's ``x-ratelimit-reset-*`` headers write it (Go's format), rounded up
    to the millisecond: ``0s``, ``20ms``, ``1s``, ``1.5s``, ``6m0s``, ``1h2m3s``."""
    ms = max(0, math.ceil(seconds * 1000 - _NOISE))
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = str(rest // 1000) if rest % 1000 == 0 else f"{rest / 1000:.3f}".rstrip("0")
    out = f"{hours}h" if hours else ""
    if hours or minutes:
        out += f"{minutes}m"
    return f"{out}{secs}s"


def remaining(limit: int, level: float) -> int:
    """Whole units still available to a rate limit of ``limit`` per minute at ``level``."""
    return max(0, math.floor(limit - level + _NOISE))


def _trio(kind: str, subjects: Sequence[tuple[int, float]]) -> dict[str, str]:
    if not subjects:
        return {}
    # The tightest subject: the fewest units left, then the longest time to refill.
    limit, level = min(subjects, key=lambda s: (remaining(*s), -max(0.0, s[1]) / s[0]))
    return {
        f"x-ratelimit-limit-{kind}": str(limit),
        f"x-ratelimit-remaining-{kind}": str(remaining(limit, level)),
        f"x-ratelimit-reset-{kind}": format_duration(max(0.0, level) * 60 / limit),
    }


def rate_limit_headers(
    requests: Sequence[tuple[int, float]], tokens: Sequence[tuple[int, float]]
) -> dict[str, str]:
    """``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` for the tightest subject.

    Each sequence holds ``(per-minute limit, level)`` for the subjects that have that limit;
    an empty one omits its three headers. ``reset`` is the time until the limit is whole again.
    """
    return {**_trio("requests", requests), **_trio("tokens", tokens)}


def retry_headers(wait: float) -> dict[str, str]:
    """``retry-after`` (whole seconds, rounded up) and ``retry-after-ms`` (which OpenAI's
    clients prefer) for a wait of ``wait`` seconds."""
    ms = max(1, math.ceil(wait * 1000 - _NOISE))
    return {"retry-after": str(math.ceil(ms / 1000)), "retry-after-ms": str(ms)}
