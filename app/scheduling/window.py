"""The in-flight window that follows the engine's load (``docs/scheduling.md``).

The fair order only holds for requests that wait in the gateway: a request that waits inside
vLLM is served first come, first served, and a newcomer the gateway lets in queues behind it.
So the window should be as large as the engine's running batch can be, and no larger:

* **Shrink** when requests keep waiting inside the engine while its memory is full (they wait
  for KV cache, not for a step): the engine's capacity is what it runs, so the window becomes
  that. Requests still waiting while the engine runs the whole window are the remainder of a
  larger window, draining: no shrink for them.
* **Grow** by one, up to ``cap`` (``max_num_seqs``: vLLM never runs more), when nothing waited
  inside the engine for a few reports in a row, the gateway holds requests back for the window,
  and the engine's memory would hold the window plus one more at its present use per running
  request. Growth never probes past the memory it can see, so the window settles instead of
  oscillating around the engine's capacity; after a shrink it waits a while before growing.

Plain logic, driven by :meth:`AdaptiveWindow.observe` with the engine's reports; time is the
reports themselves (each engine step is one), never a clock.
"""

from __future__ import annotations

from app.engine.base import EngineLoad

# KV cache use (0-1) at which the engine counts as full.
KV_FULL = 0.9
# Consecutive reports with requests waiting inside the engine before the window shrinks: a
# request added just before a step waits through that one report, which is no sign of a limit.
SHRINK_AFTER = 2
# Consecutive reports with nothing waiting before each step of growth.
GROW_AFTER = 3
# Reports after a shrink before growth is considered again.
HOLD_AFTER_SHRINK = 10


class AdaptiveWindow:
    def __init__(self, *, cap: int, floor: int) -> None:
        self.cap = cap
        self.floor = max(1, min(floor, cap))
        self.size = cap
        self._last_step: int | None = None
        self._queued = 0  # consecutive reports with requests waiting inside the engine
        self._clear = 0  # ... and with none
        self._hold = 0  # reports still to pass before growth is considered

    def observe(self, load: EngineLoad, *, held_back: bool) -> int:
        """The window after the engine's report ``load``; ``held_back``: requests wait in the
        gateway that the window (not their tenants' shares) keeps out. A report already seen
        changes nothing."""
        if load.step == self._last_step:
            return self.size
        self._last_step = load.step
        if load.waiting > 0:
            self._clear = 0
            self._queued += 1
            full = load.kv_cache_usage >= KV_FULL
            if self._queued >= SHRINK_AFTER and full and load.running < self.size:
                self.size = max(self.floor, load.running)
                self._queued = 0
                self._hold = HOLD_AFTER_SHRINK
            return self.size
        self._queued = 0
        if self._hold > 0:
            self._hold -= 1
            return self.size
        self._clear += 1
        if self._clear >= GROW_AFTER and held_back and self._fits_one_more(load):
            self.size = min(self.cap, self.size + 1)
            self._clear = 0
        return self.size

    def _fits_one_more(self, load: EngineLoad) -> bool:
        """Whether the engine's KV cache would hold the window plus one request, each using
        what a running request uses now."""
        if load.running == 0:
            return True
        per_request = load.kv_cache_usage / load.running
        return per_request * (self.size + 1) < KV_FULL
