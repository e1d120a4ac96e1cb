"""A gateway's polls of the store, counted: "another replica sees a change by its next poll"
is judged by the polls themselves, not by a clock that a busy machine slows.

    with store_polls(second.gateway) as polls:
        ... make the change through another replica ...
        polls.expect(lambda: <the second replica shows the change>)
        assert await polls.seen_async() <= 2  # polls.seen() from another thread
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from app.gateway import Gateway


class StorePolls:
    """Counts the polls a gateway completes (each ends by recording its keys' use), and the
    poll whose reload first shows an expected change."""

    def __init__(self) -> None:
        self.completed = 0
        self._since = 0
        self._holds: Callable[[], bool] | None = None
        self._seen_in: int | None = None

    def expect(self, holds: Callable[[], bool]) -> None:
        """Watch for ``holds`` from now on: a change already made and not yet polled."""
        self._since = self.completed
        self._holds = holds
        # Seen already: by a poll that ran between the change and this call.
        self._seen_in = 0 if holds() else None

    def reloaded(self) -> None:
        """A poll reloaded the store: the poll in progress counts from 1 after ``expect``."""
        if self._holds is not None and self._seen_in is None and self._holds():
            self._seen_in = self.completed - self._since + 1

    def seen(self, hang_seconds: float = 60) -> int:
        """The poll, counted from :meth:`expect`, whose reload first showed the change (0: one
        before it); ``hang_seconds`` bounds only a hang. The poll in progress may have read
        the store before the change, so 2 is the next poll's."""
        deadline = time.monotonic() + hang_seconds
        while self._seen_in is None:
            assert time.monotonic() < deadline, "no poll ever showed the change"
            time.sleep(0.01)
        return self._seen_in

    async def seen_async(self, hang_seconds: float = 60) -> int:
        """:meth:`seen`, from the gateway's own event loop."""
        deadline = time.monotonic() + hang_seconds
        while self._seen_in is None:
            assert time.monotonic() < deadline, "no poll ever showed the change"
            await asyncio.sleep(0.01)
        return self._seen_in

    async def run_async(self, count: int, hang_seconds: float = 60) -> None:
        """Wait, on the gateway's own event loop, until ``count`` more polls have run."""
        deadline, until = time.monotonic() + hang_seconds, self.completed + count
        while self.completed < until:
            assert time.monotonic() < deadline, f"fewer than {count} polls ran"
            await asyncio.sleep(0.01)


@contextmanager
def store_polls(gateway: Gateway) -> Iterator[StorePolls]:
    """``gateway``'s polls counted while the block runs."""
    polls = StorePolls()
    touch_keys, reload = gateway.admin.touch_keys, gateway.reload

    async def touched(*args: Any, **kwargs: Any) -> None:
        try:
            await touch_keys(*args, **kwargs)
        finally:
            polls.completed += 1

    async def reloaded() -> None:
        await reload()
        polls.reloaded()

    gateway.admin.touch_keys = touched  # type: ignore[method-assign]
    gateway.reload = reloaded  # type: ignore[method-assign]
    try:
        yield polls
    finally:
        del gateway.admin.touch_keys
        del gateway.reload
