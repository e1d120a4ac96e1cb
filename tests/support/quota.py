"""What the quota suite shares: the clocks it moves time with (an injected one for the
in-process backend, real sleeps for Redis, whose clock is its own), its subjects, and a crowd
of simultaneous reservations."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Protocol

from app.quota import Limits, QuotaExceeded, Reservation
from app.quota.backend import QuotaBackend


class Clock(Protocol):
    exact: bool
    """Whether time moves only when told (waits can be compared exactly)."""

    async def advance(self, seconds: float) -> None: ...


class FakeClock:
    exact = True

    def __init__(self, start: float = 1_767_225_600.0) -> None:  # 2026-01-01T00:00:00Z
        self.now = start

    def __call__(self) -> float:
        return self.now

    async def advance(self, seconds: float) -> None:
        self.now += seconds


class RealClock:
    exact = False

    async def advance(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


MakeBackend = Callable[..., QuotaBackend]


TENANT = "tenant:acme"
KEY = "key:k1"


async def attempt(
    backend: QuotaBackend, subjects: list[tuple[str, Limits]], tokens: int
) -> Reservation | QuotaExceeded:
    try:
        return await backend.reserve(subjects, tokens)
    except QuotaExceeded as exc:
        return exc


async def crowd(
    backends: Sequence[QuotaBackend], subjects: list[tuple[str, Limits]], tokens: int, n: int
) -> tuple[list[Reservation], list[QuotaExceeded]]:
    """``n`` simultaneous reservations, spread over ``backends``."""
    results = await asyncio.gather(
        *(attempt(backends[i % len(backends)], subjects, tokens) for i in range(n))
    )
    admitted = [r for r in results if isinstance(r, Reservation)]
    refused = [r for r in results if isinstance(r, QuotaExceeded)]
    return admitted, refused
