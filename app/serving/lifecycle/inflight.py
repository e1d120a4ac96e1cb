"""Which adapter versions have requests running, so removal can wait for them."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from app.tenancy.adapters import Adapter


class InFlight:
    def __init__(self) -> None:
        self._running: Counter[int] = Counter()
        self._changed = asyncio.Event()

    @contextmanager
    def hold(self, adapter: Adapter | None) -> Iterator[None]:
        if adapter is None:
            yield
            return
        self._running[adapter.lora_id] += 1
        try:
            yield
        finally:
            self._running[adapter.lora_id] -= 1
            if not self._running[adapter.lora_id]:
                del self._running[adapter.lora_id]
                self._changed.set()

    @property
    def idle(self) -> bool:
        """Whether no request holds an adapter."""
        return not self._running

    async def wait_idle(self, adapter: Adapter) -> None:
        while self._running[adapter.lora_id]:
            self._changed.clear()
            await self._changed.wait()
