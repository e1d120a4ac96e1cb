"""First come, first served: every request goes straight to the engine (vLLM's own FCFS
queue), as before the fair scheduler; the front role, whose fairness the llm-d router's flow
control provides, admits this way too."""

from __future__ import annotations

from collections.abc import Callable

from app.engine.base import Engine
from app.scheduling.base import Ticket


class FcfsAdmission:
    def __init__(self, *, spare: bool = False) -> None:
        """``spare``: whether work that may only use spare capacity (shadows) goes in too,
        where something after this admission drops it first under load (the front role's
        upstream pool, for a sheddable objective); the in-process engine's FCFS queue cannot,
        so by default it is dropped."""
        self._spare = spare

    def admit(self, ticket: Ticket) -> PassThrough:
        return PassThrough()

    async def spare(
        self, ticket: Ticket, preempt: Callable[[], object], *, wait: float
    ) -> PassThrough | None:
        return PassThrough() if self._spare else None

    def follow(self, engine: Engine | None) -> None:
        return None


class PassThrough:
    through_headroom = False

    async def acquire(self) -> None:
        return None

    def settle(self, tokens: int) -> None:
        return None

    def started(self) -> None:
        return None

    def release(self) -> None:
        return None
