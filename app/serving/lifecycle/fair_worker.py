"""One worker thread shared fairly: tenants take turns, one job each, in arrival order.

The tokenizer runs every request's prompt through one thread (a Hugging Face tokenizer is not
safe to share between threads). First come, first served, a tenant that queues many long
prompts would hold every other tenant behind all of them; taking the tenants in turn, another
tenant waits for at most the one job that is running, whatever is queued.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(eq=False)
class _Job(Generic[T]):
    owner: str
    work: Callable[[], T]
    result: asyncio.Future[T]


class FairWorker:
    """Runs callables on one thread, one at a time; the next job is the oldest of the tenant
    after the last served one (round robin over the tenants with jobs waiting)."""

    def __init__(self, thread_name: str) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name)
        self._waiting: OrderedDict[str, deque[_Job[Any]]] = OrderedDict()
        self._running: Future[Any] | None = None

    @property
    def idle(self) -> bool:
        """Nothing running and nothing waiting: the thread's resource is free to use."""
        return self._running is None and not self._waiting

    async def run(self, owner: str, work: Callable[[], T]) -> T:
        """``work()``'s result, run on the thread in ``owner``'s turn. Cancelled while it
        waits, the job is dropped; once it runs, it runs to its end (the thread cannot be
        interrupted), and the next job waits for that."""
        job = _Job(owner, work, asyncio.get_running_loop().create_future())
        self._waiting.setdefault(owner, deque()).append(job)
        self._start_next()
        try:
            return await asyncio.shield(job.result)
        except asyncio.CancelledError:
            queue = self._waiting.get(owner)
            if queue is not None and job in queue:
                queue.remove(job)
                if not queue:
                    del self._waiting[owner]
            raise

    def close(self) -> None:
        """Drop the waiting jobs (their awaiters are cancelled) and wait for the running one."""
        for queue in self._waiting.values():
            for job in queue:
                job.result.cancel()
        self._waiting.clear()
        self._thread.shutdown(wait=True, cancel_futures=True)

    def _start_next(self) -> None:
        if self._running is not None or not self._waiting:
            return
        owner, queue = next(iter(self._waiting.items()))
        job = queue.popleft()
        if not queue:
            del self._waiting[owner]
        loop = job.result.get_loop()
        running = self._thread.submit(job.work)
        self._running = running
        running.add_done_callback(lambda done: loop.call_soon_threadsafe(self._ended, job, done))

    def _ended(self, job: _Job[Any], done: Future[Any]) -> None:
        self._running = None
        if job.owner in self._waiting:
            # Its next job goes behind every tenant that came while this one ran.
            self._waiting.move_to_end(job.owner)
        if not job.result.done():  # else the worker was closed
            if done.cancelled():
                job.result.cancel()
            elif (error := done.exception()) is not None:
                job.result.set_exception(error)
            else:
                job.result.set_result(done.result())
        self._start_next()
