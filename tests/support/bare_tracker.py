"""A request tracker with nothing behind it, for tests of one of its steps alone."""

from __future__ import annotations

import asyncio
from typing import Any

from app.serving.lifecycle.tracking import RequestTracker


def bare_tracker(**options: Any) -> RequestTracker:
    """A tracker with no registry, in-flight table, ledger or quota (a step that reaches one
    fails), holding no adapter copies unless ``options`` say so."""
    return RequestTracker(
        lambda: None,  # type: ignore[arg-type, return-value]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        asyncio.ensure_future,
        lease_seconds=60,
        **{"held_copy": None, **options},
    )
