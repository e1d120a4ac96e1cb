"""What the tracker holds for a request is let go when the request is cancelled midway, also
while that work still runs in a thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from app.serving.lifecycle.tracking import RequestTracker
from app.tenancy.adapters import Adapter
from app.tenancy.tenants import ModelTarget


async def test_an_adapter_copy_fetched_for_a_request_that_left_is_let_go(tmp_path: Path) -> None:
    fetching, fetched = threading.Event(), threading.Event()
    entered, exited = [], []

    @contextmanager
    def slow_copy() -> Iterator[Path]:
        fetching.set()
        fetched.wait(10)  # a cold download
        entered.append(1)
        try:
            yield tmp_path
        finally:
            exited.append(1)

    adapter = Adapter("a", 1, "0" * 64, tmp_path / "elsewhere", 8, ("q_proj",), lora_id=1)
    target = ModelTarget(model="a", adapter=adapter)
    with ExitStack() as holds:
        task = asyncio.create_task(
            RequestTracker._on_this_host(target, adapter, holds, slow_copy())
        )
        await asyncio.to_thread(fetching.wait, 10)
        task.cancel()  # the client left during the download
        with pytest.raises(asyncio.CancelledError):
            await task
    fetched.set()  # the download ends after the request did
    for _ in range(500):
        if exited:
            break
        await asyncio.sleep(0.01)
    assert (entered, exited) == ([1], [1])
