"""How a quota store's failures are counted and logged: every failure is counted (by
operation and reason); the log says when an outage starts, how it goes on (at most once per
``SUMMARY_EVERY_S``, with the failures since) and when it ends, not once per request."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

from app import metrics

logger = logging.getLogger("app.quota")

SUMMARY_EVERY_S = 60.0


class OutageLog:
    """The state of one backend's store, as its operations find it."""

    def __init__(self, *, fail_open: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self._mode = "admitting unchecked" if fail_open else "refusing requests"
        self._clock = clock
        self._down_since: float | None = None
        self._last_log = 0.0
        self._since_log: Counter[str] = Counter()

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def failed(self, operation: str, reason: str, cause: BaseException | None) -> None:
        metrics.QUOTA_BACKEND_ERRORS.labels(operation, reason).inc()
        now = self._clock()
        self._since_log[f"{operation}/{reason}"] += 1
        if self._down_since is None:
            self._down_since = self._last_log = now
            self._since_log.clear()
            logger.error(
                "quota store failing (%s on %s: %r): %s",
                reason,
                operation,
                cause,
                self._mode,
            )
        elif now - self._last_log >= SUMMARY_EVERY_S:
            counts = ", ".join(f"{name} x{n}" for name, n in sorted(self._since_log.items()))
            logger.error(
                "quota store still failing after %.0f s (%s; last: %r): %s",
                now - self._down_since,
                counts,
                cause,
                self._mode,
            )
            self._last_log = now
            self._since_log.clear()

    def succeeded(self) -> None:
        if self._down_since is not None:
            logger.warning(
                "quota store answering again after %.0f s", self._clock() - self._down_since
            )
            self._down_since = None
            self._since_log.clear()
