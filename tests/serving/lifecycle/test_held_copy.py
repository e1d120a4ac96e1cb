"""A request's adapter content, held on this host while it runs: entered on the event loop
where that cannot wait (a local store's directory), in a thread where it may (a fetch), and let
go when the request is cancelled midway, also while the fetch still runs in its thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import TracebackType

import pytest

from app.tenancy.adapters import Adapter
from app.tenancy.storage.local import LocalAdapterStore
from app.tenancy.storage.s3 import S3AdapterStore
from app.tenancy.tenants import ModelTarget
from tests.support.bare_tracker import bare_tracker

ADAPTER = Adapter("legal", 1, "a" * 64, Path("/registered/legal"), 8, ("q_proj",), 1)


class RecordedCopy:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.entered_on: str | None = None
        self.exited = False

    def __enter__(self) -> Path:
        self.entered_on = threading.current_thread().name
        return self.path

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.exited = True


@pytest.mark.parametrize("waits", [False, True])
async def test_the_copy_is_held_until_the_request_ends_and_entered_where_it_may_wait(
    waits: bool,
) -> None:
    copy = RecordedCopy(Path("/this-host/legal"))
    with ExitStack() as holds:
        target = await bare_tracker(held_copy_waits=waits)._on_this_host(
            ModelTarget("legal", ADAPTER), ADAPTER, holds, copy
        )
        assert target.adapter is not None and target.adapter.path == copy.path
        assert not copy.exited
    assert copy.exited
    on_the_loop = copy.entered_on == threading.current_thread().name
    assert on_the_loop is not waits


def test_only_a_local_store_s_copy_is_entered_without_a_thread() -> None:
    assert not LocalAdapterStore.held_copy_waits
    assert S3AdapterStore.held_copy_waits


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
            bare_tracker(held_copy_waits=True)._on_this_host(target, adapter, holds, slow_copy())
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
