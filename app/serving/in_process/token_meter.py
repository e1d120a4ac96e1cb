"""What an in-process request produced, counted as the engine's deltas arrive: completion
tokens, time to first token, queue wait and inter-token latency."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from vllm import RequestOutput

from app import metrics

_INTER_TOKEN_LATENCY = metrics.Children(metrics.INTER_TOKEN_LATENCY)
_TIME_TO_FIRST_TOKEN = metrics.Children(metrics.TIME_TO_FIRST_TOKEN)
_QUEUE_WAIT = metrics.Children(metrics.QUEUE_WAIT)


@dataclass
class TokenMeter:
    """Completion tokens the engine produced, and their timing metrics as they come.

    Inter-token latency is one observation per token after a request's first: a delta of
    several tokens spreads its gap evenly over them. A first delta of several tokens (a
    consumer slower than the engine gets its outputs merged) spreads the engine's own
    first-to-last token time over the tokens after its first. Every observation is held in
    memory until this process's metrics are read (:func:`app.metrics.held`)."""

    tenant: str
    model: str
    started: float = field(default_factory=time.monotonic)
    completion_tokens: int = 0
    last_token_at: float | None = None
    # The clock the gaps are read from (a test's own; never time.monotonic patched, which
    # every thread's event loop reads).
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    _gaps: metrics.HistogramTally | None = field(default=None, init=False, repr=False)

    def observe(self, output: RequestOutput) -> bool:
        """Count ``output``'s tokens; whether it held any (then ``last_token_at`` is now)."""
        new = 0
        for choice in output.outputs:
            new += len(choice.token_ids)
        if new:
            self.completion_tokens += new
            now = self.clock()
            if self.last_token_at is None:
                self._first_token(output, now)
                if new > 1:
                    self._first_delta_gaps(output, new - 1)
            else:
                self._tally().observe((now - self.last_token_at) / new, new)
            self.last_token_at = now
        return new > 0

    def _tally(self) -> metrics.HistogramTally:
        if self._gaps is None:
            self._gaps = metrics.held(_INTER_TOKEN_LATENCY(self.tenant, self.model))
        return self._gaps

    def _first_delta_gaps(self, output: RequestOutput, gaps: int) -> None:
        stats = output.metrics
        if stats is not None and stats.last_token_ts >= stats.first_token_ts > 0:
            # Both on the engine core's clock; this consumer saw the tokens only at once.
            self._tally().observe((stats.last_token_ts - stats.first_token_ts) / gaps, gaps)

    def _first_token(self, output: RequestOutput, now: float) -> None:
        metrics.held(_TIME_TO_FIRST_TOKEN(self.tenant, self.model)).observe(now - self.started)
        stats = output.metrics
        if stats is not None and stats.scheduled_ts >= stats.queued_ts > 0:
            # Both on the engine core's clock.
            wait = stats.scheduled_ts - stats.queued_ts
            metrics.held(_QUEUE_WAIT(self.tenant, self.model)).observe(wait)
