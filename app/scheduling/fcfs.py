"""First come, first served: every request goes straight to the engine (vLLM's own FCFS
queue), as before the fair scheduler; the front role, whose fairness the llm-d router's flow
control provides, admits this way too."""

from __future__ import annotations

from app.engine.base import Engine
from app.scheduling.base import Ticket


class FcfsAdmission:
    def admit(self, ticket: Ticket) -> PassThrough:
        return PassThrough()

    def follow(self, engine: Engine | None) -> None:
        return None


class PassThrough:
    async def acquire(self) -> None:
        return None

    def settle(self, tokens: int) -> None:
        return None

    def release(self) -> None:
        return None
