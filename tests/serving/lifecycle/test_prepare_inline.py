"""A small request is tokenised on the event loop when the tokenizer thread is idle, and only
then: the tokenizer is never used by two threads at once."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

from app.serving.lifecycle.tracking import INLINE_PREPARE_BYTES, RequestTracker


class RecordingService:
    """``prepare`` records the thread it ran on; the first may be held until released."""

    def __init__(self) -> None:
        self.threads: list[str] = []
        self.release = threading.Event()
        self.hold = False
        self.busy = threading.Lock()

    def prepare(self, request: Any, principal: Any, target: Any, request_id: str) -> str:
        if not self.busy.acquire(blocking=False):
            raise AssertionError("the tokenizer is in use by another thread")
        try:
            self.threads.append(threading.current_thread().name)
            if self.hold:
                self.release.wait(60)  # bounds a hang only
            return request_id
        finally:
            self.busy.release()


def tracker() -> RequestTracker:
    return RequestTracker(
        lambda: None,  # type: ignore[arg-type, return-value]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        asyncio.ensure_future,
        lease_seconds=60,
        held_copy=None,
    )


async def prepare(
    tracker: RequestTracker, service: RecordingService, size: int | None, tenant: str = "t"
) -> Any:
    principal = SimpleNamespace(tenant=SimpleNamespace(id=tenant))
    return await tracker._prepare(service, None, principal, None, "r", size)  # type: ignore[arg-type]


async def test_small_bodies_on_the_loop_large_or_unknown_ones_on_the_thread() -> None:
    subject, service = tracker(), RecordingService()
    loop_thread = threading.current_thread().name
    try:
        await prepare(subject, service, 200)
        await prepare(subject, service, INLINE_PREPARE_BYTES + 1)
        await prepare(subject, service, None)
        await prepare(subject, service, INLINE_PREPARE_BYTES)
    finally:
        subject.close()
    assert service.threads[0] == service.threads[3] == loop_thread
    assert service.threads[1].startswith("tokenizer")
    assert service.threads[2].startswith("tokenizer")


async def test_a_small_body_queues_behind_the_thread_while_it_works() -> None:
    subject, service = tracker(), RecordingService()
    service.hold = True
    try:
        large = asyncio.ensure_future(prepare(subject, service, None))
        while not service.threads:
            await asyncio.sleep(0.001)
        small = asyncio.ensure_future(prepare(subject, service, 10))
        await asyncio.sleep(0.01)
        assert not small.done()
        service.hold = False
        service.release.set()
        assert await asyncio.gather(large, small) == ["r", "r"]
    finally:
        subject.close()
    assert all(name.startswith("tokenizer") for name in service.threads)


async def test_a_request_cancelled_while_queued_does_not_free_the_tokenizer_early() -> None:
    subject, service = tracker(), RecordingService()
    service.hold = True
    try:
        working = asyncio.ensure_future(prepare(subject, service, None))
        while not service.threads:
            await asyncio.sleep(0.001)
        queued = asyncio.ensure_future(prepare(subject, service, None))
        await asyncio.sleep(0.01)
        queued.cancel()  # its client left while it waited for the thread
        await asyncio.gather(queued, return_exceptions=True)
        # The thread is still busy with the first: a small body must not take the tokenizer.
        small = asyncio.ensure_future(prepare(subject, service, 10))
        await asyncio.sleep(0.01)
        service.hold = False
        service.release.set()
        assert await asyncio.gather(working, small) == ["r", "r"]
    finally:
        subject.close()


async def test_another_tenant_waits_for_the_running_job_only_not_for_a_flood() -> None:
    subject, service = tracker(), RecordingService()
    service.hold = True
    finished: list[str] = []

    async def tokenised(tenant: str) -> None:
        await prepare(subject, service, None, tenant)
        finished.append(tenant)

    try:
        flood = [asyncio.ensure_future(tokenised("attacker")) for _ in range(4)]
        while not service.threads:
            await asyncio.sleep(0.001)
        victim = asyncio.ensure_future(tokenised("victim"))
        await asyncio.sleep(0.01)
        service.hold = False
        service.release.set()
        await asyncio.gather(*flood, victim)
    finally:
        subject.close()
    assert finished == ["attacker", "victim", "attacker", "attacker", "attacker"]
