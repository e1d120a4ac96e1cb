"""Wall time in the gateway's own code per request, by phase, as
``lora_gateway_overhead_seconds{role,phase}`` (and, where the setting asks, the
``x-gateway-overhead-ms`` header).

The phases, in a request's order:

- ``authentication``: from the request's arrival at the app to its route: the key checked,
  the body read and parsed;
- ``resolution``: the model resolved for the tenant (its adapter version, this host's copy)
  and the limits that need no token count checked;
- ``preparation``: the prompt templated and tokenised, the sampling built, the worst case
  reserved against the quotas;
- ``engine``: the way to the engine (the run built, the upstream's request written) and back,
  for every output: from its arrival to its event written to the client;
- ``settlement``: the run closed, the quotas reconciled, the metrics and the usage record.

The fair queue's wait for an engine slot is not in any (it has its own metric), nor is the
engine's time, nor the time waiting for the client's connection between outputs.

Each phase is bracketed by :meth:`RequestOverhead.begin` and :meth:`RequestOverhead.end`
(``engine``, made of many pieces, is added up with :meth:`RequestOverhead.add`): the points
where tracing spans hang. A :class:`PhaseHook` set with :func:`set_hook` (an
OpenTelemetry tracer's, say) is told of each phase's bounds; with none, a phase costs two
clock reads.
"""

from __future__ import annotations

import time
from typing import Any, Final, Literal, Protocol

from app import metrics

Phase = Literal["authentication", "resolution", "preparation", "engine", "settlement"]
PHASES: Final[tuple[Phase, ...]] = (
    "authentication",
    "resolution",
    "preparation",
    "engine",
    "settlement",
)
HEADER: Final = "x-gateway-overhead-ms"
STATE: Final = "overhead"
"""The key of a request's :class:`RequestOverhead` in its ASGI scope's ``state``."""

clock = time.perf_counter
_OVERHEAD = metrics.Children(metrics.OVERHEAD)


class PhaseHook(Protocol):
    """Told of each phase's bounds as the request passes them."""

    def began(self, overhead: RequestOverhead, phase: Phase) -> None: ...

    def ended(self, overhead: RequestOverhead, phase: Phase, seconds: float) -> None: ...


_hook: PhaseHook | None = None


def set_hook(hook: PhaseHook | None) -> None:
    """Tell ``hook`` of every request's phases from now on (``None``: none)."""
    global _hook
    _hook = hook


class RequestOverhead:
    """One request's time in the gateway's own code, phase by phase, in ``role``;
    ``header``: whether its response carries the ``x-gateway-overhead-ms`` header."""

    __slots__ = ("_began", "_seconds", "header_wanted", "role", "trace")

    def __init__(self, role: str, *, header: bool = False) -> None:
        self.role = role
        self.header_wanted = header
        self.trace: Any = None
        """The request's trace, where it is traced (app.tracing's ``RequestTrace``, which a
        hook finds here; this module knows nothing of it)."""
        self._seconds: dict[Phase, float] = dict.fromkeys(PHASES, 0.0)
        self._began = 0.0

    def begin(self, phase: Phase) -> None:
        """``phase`` begins (phases never overlap: one ends before the next begins)."""
        if _hook is not None:
            _hook.began(self, phase)
        self._began = clock()

    def end(self, phase: Phase) -> None:
        """``phase`` ends."""
        self.add(phase, clock() - self._began)

    def add(self, phase: Phase, seconds: float) -> None:
        """``seconds`` more of ``phase`` (a phase made of many pieces, as ``engine``)."""
        self._seconds[phase] += seconds
        if _hook is not None:
            _hook.ended(self, phase, seconds)

    def seconds(self, phase: Phase) -> float:
        return self._seconds[phase]

    def total_ms(self) -> float:
        """Every phase so far, in milliseconds."""
        return sum(self._seconds.values()) * 1000

    def header(self) -> tuple[str, str]:
        """The ``x-gateway-overhead-ms`` header: the phases so far."""
        return HEADER, f"{self.total_ms():.3f}"

    def observe(self) -> None:
        """Each phase into the histogram, once the request is settled."""
        for phase, seconds in self._seconds.items():
            metrics.held(_OVERHEAD(self.role, phase)).observe(seconds)
