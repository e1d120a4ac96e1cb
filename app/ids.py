"""Random ids made on the request path."""

from __future__ import annotations

import os
import re
import time

_TIME_ORDERED = re.compile(r"(?:[a-z]+_)?([0-9a-f]{12})[0-9a-f]{20}")


def random_hex() -> str:
    """128 random bits as 32 hex digits: the form of a UUID4's ``hex`` and as unguessable,
    for a fraction of its cost (a request makes several)."""
    return os.urandom(16).hex()


def time_ordered_hex() -> str:
    """32 hex digits, UUIDv7's layout without its version bits: the time in milliseconds (12
    digits), then 80 random bits. A request's id, and so its Response's: :func:`minted_at`
    reads when it was made, which tells a store read that misses a young id that its write may
    still be on its way from another replica."""
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"


def minted_at(identifier: str) -> float | None:
    """When an id of :func:`time_ordered_hex` (or one with a ``prefix_``) was made, in seconds
    since the epoch; None for an id of another form."""
    matched = _TIME_ORDERED.fullmatch(identifier)
    return None if matched is None else int(matched[1], 16) / 1000
