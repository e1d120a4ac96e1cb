"""The attacker: a process of its own (its Python work must not slow the victim's client in
this one), lowered in priority (on a shared machine it stands in for a client elsewhere, and
should not win the CPU the gateway and the victim need), sending from other loopback
addresses than the victim's (it is another client: a per-address cap applies to it alone).

Four ways of attacking, by :attr:`AttackPlan.kind`:

* ``flood``: ``concurrency`` workers, each sending the plan's requests in turn, one after
  another, as fast as they are answered;
* ``trickle``: ``concurrency`` connections, each sending the plan's first request and then
  one byte of ``drip`` every ``trickle_interval`` seconds, never finishing; when the gateway
  closes one, another opens;
* ``slow-read``: ``concurrency`` streamed requests read up to their status line and then not
  at all (a small receive buffer, so the gateway's writes back up soon), each held for
  ``hold_seconds``, then what the gateway did with it is read; then another.

Every outcome is counted by name: the reply's status (``"429"``), or how the connection ended
(:mod:`tools.abuse.wire`), or for ``slow-read`` what became of the stream. Every loop stops on
the orchestrator's signal, at ``max_seconds``, or after ``max_attempts``, whichever is first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

from tools.abuse.wire import CLOSED, CONNECT_FAILED, RESET, TIMEOUT, connect, exchange, status_of

ATTACKER_SOURCES = ("127.0.0.2",)
STOP_POLL_SECONDS = 0.1
SLOW_READ_BUFFER = 4096
DRAIN_SECONDS = 2.0
END_OF_CHUNKED_BODY = b"0\r\n\r\n"
IN_FLIGHT_AT_STOP = "in flight at stop"
WARM_UP = "warm-up "


@dataclass(frozen=True)
class AttackPlan:
    kind: str  # flood | trickle | slow-read
    port: int
    requests: tuple[bytes, ...]
    concurrency: int = 4
    # Sent one after another before the attack, their outcomes counted apart (the capped
    # tenant spends its one request a minute on them).
    warm_up: tuple[bytes, ...] = ()
    sources: tuple[str, ...] = ATTACKER_SOURCES
    drip: bytes = b"a"
    trickle_interval: float = 1.0
    hold_seconds: float = 40.0
    request_timeout: float = 60.0
    max_seconds: float = 300.0
    max_attempts: int = 200_000
    niceness: int = 10


class Attack:
    """One run of a plan: its tally, its bounds, and when its first wave is out."""

    def __init__(
        self, plan: AttackPlan, stop_requested: Callable[[], bool], on_ready: Callable[[], None]
    ) -> None:
        if not plan.requests:
            raise ValueError("an attack needs at least one request")
        self.plan = plan
        self.tally: Counter[str] = Counter()
        self.attempts = 0
        self._stop_requested = stop_requested
        self._on_ready = on_ready
        self._started_workers = 0
        self._deadline = time.monotonic() + plan.max_seconds

    def stopping(self) -> bool:
        """Told to stop, or past the deadline: what is in flight is cut short."""
        return time.monotonic() >= self._deadline or self._stop_requested()

    def attempt(self) -> bool:
        """Count one more attempt; False once the attack is stopping or has made its
        ``max_attempts`` (those in flight then run to their end)."""
        if self.stopping() or self.attempts >= self.plan.max_attempts:
            return False
        self.attempts += 1
        return True

    def worker_started(self) -> None:
        """A worker's first attempt is out; the wave is, once every worker's is."""
        self._started_workers += 1
        if self._started_workers == self.plan.concurrency:
            self._on_ready()

    def source(self, worker: int) -> str:
        return self.plan.sources[worker % len(self.plan.sources)]

    async def run(self) -> Counter[str]:
        for request in self.plan.warm_up:
            reply = await exchange(request, port=self.plan.port, timeout=self.plan.request_timeout)
            self.tally[WARM_UP + reply.outcome] += 1
        worker = {"flood": self._flood, "trickle": self._trickle, "slow-read": self._slow_read}[
            self.plan.kind
        ]
        workers = [asyncio.create_task(worker(n)) for n in range(self.plan.concurrency)]
        watcher = asyncio.create_task(self._watch(workers))
        ended = await asyncio.gather(*workers, return_exceptions=True)
        watcher.cancel()
        for result in ended:
            # A bug of the attacker's is shown, not taken for something the gateway did.
            if isinstance(result, Exception):
                self.tally[f"attacker error: {type(result).__name__}"] += 1
        return self.tally

    async def _watch(self, workers: list[asyncio.Task[None]]) -> None:
        """Cancel what is in flight once the attack is stopping, not at the end of its
        exchange (a trickle or a held stream has none)."""
        while not self.stopping():
            if all(task.done() for task in workers):
                return
            await asyncio.sleep(STOP_POLL_SECONDS)
        if self.plan.kind == "slow-read":
            # A held stream stops being held at once; what became of it takes a moment to read.
            await asyncio.wait(workers, timeout=DRAIN_SECONDS + 1)
        for task in workers:
            task.cancel()

    async def _flood(self, worker: int) -> None:
        number = worker
        first = True
        while self.attempt():
            request = self.plan.requests[number % len(self.plan.requests)]
            number += self.plan.concurrency
            sending = exchange(
                request,
                port=self.plan.port,
                timeout=self.plan.request_timeout,
                source=self.source(worker),
            )
            if first:
                self.worker_started()
                first = False
            try:
                reply = await sending
            except asyncio.CancelledError:
                self.tally[IN_FLIGHT_AT_STOP] += 1
                raise
            self.tally[reply.outcome] += 1

    async def _trickle(self, worker: int) -> None:
        first = True
        while self.attempt():
            opened = time.monotonic()
            try:
                outcome = await self._trickle_once(worker, first)
            except asyncio.CancelledError:
                self.tally[IN_FLIGHT_AT_STOP] += 1
                raise
            first = False
            self.tally[outcome] += 1
            # A connection refused at once is opened again a drip later, not in a tight loop:
            # the attack is holding connections, not opening them.
            await asyncio.sleep(max(0.0, opened + self.plan.trickle_interval - time.monotonic()))

    async def _trickle_once(self, worker: int, first: bool) -> str:
        """One connection: the head sent, then a byte at a time until the gateway ends it."""
        try:
            reader, writer = await connect(self.plan.port, source=self.source(worker))
        except OSError:
            if first:
                self.worker_started()
            return CONNECT_FAILED
        reading = asyncio.create_task(_first_bytes(reader))
        try:
            writer.write(self.plan.requests[worker % len(self.plan.requests)])
            if first:
                self.worker_started()
            while True:
                done, _ = await asyncio.wait({reading}, timeout=self.plan.trickle_interval)
                if done:
                    data, reset = reading.result()
                    return status_of(data) or (RESET if reset else CLOSED)
                with contextlib.suppress(OSError):
                    writer.write(self.plan.drip)
        finally:
            reading.cancel()
            writer.close()

    async def _slow_read(self, worker: int) -> None:
        first = True
        while self.attempt():
            try:
                outcome = await self._slow_read_once(worker, first)
            except asyncio.CancelledError:
                self.tally[IN_FLIGHT_AT_STOP] += 1
                raise
            first = False
            self.tally[outcome] += 1
            if not outcome.startswith("200"):
                # A refusal comes back at once: do not spin on it.
                await asyncio.sleep(0.1)

    async def _slow_read_once(self, worker: int, first: bool) -> str:
        try:
            reader, writer = await connect(
                self.plan.port,
                source=self.source(worker),
                receive_buffer=SLOW_READ_BUFFER,
                limit=SLOW_READ_BUFFER // 4,
            )
        except OSError:
            if first:
                self.worker_started()
            return CONNECT_FAILED
        try:
            writer.write(self.plan.requests[worker % len(self.plan.requests)])
            try:
                head = await asyncio.wait_for(
                    reader.readuntil(b"\r\n\r\n"), self.plan.request_timeout
                )
            except asyncio.TimeoutError:
                return TIMEOUT
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
                return RESET
            finally:
                if first:
                    self.worker_started()
            status = status_of(head) or CLOSED
            if status != "200":
                return status
            await self._hold()
            return "200, then " + await _what_became_of_the_stream(reader)
        finally:
            writer.close()

    async def _hold(self) -> None:
        """Read nothing for ``hold_seconds``, or until the attack is over."""
        until = time.monotonic() + self.plan.hold_seconds
        while time.monotonic() < until and not self.stopping():
            await asyncio.sleep(STOP_POLL_SECONDS)


async def _first_bytes(reader: asyncio.StreamReader) -> tuple[bytes, bool]:
    """The first bytes the gateway sends (an error reply, or nothing when it closes), and
    whether the connection was reset."""
    try:
        data = await reader.read(4096)
    except (ConnectionResetError, BrokenPipeError):
        return b"", True
    return data, False


async def _what_became_of_the_stream(reader: asyncio.StreamReader) -> str:
    """Read what is left for a moment: the stream's end (the gateway wrote it all into the
    socket's buffers), a close or reset without it (the gateway dropped the reader), or more
    data still coming (it is still serving the stream)."""
    tail = b""
    until = time.monotonic() + DRAIN_SECONDS
    try:
        while (left := until - time.monotonic()) > 0:
            chunk = await asyncio.wait_for(reader.read(1 << 16), left)
            if not chunk:
                return "read to its end" if tail.endswith(END_OF_CHUNKED_BODY) else "dropped"
            tail = (tail + chunk)[-16:]
    except asyncio.TimeoutError:
        pass
    except (ConnectionResetError, BrokenPipeError):
        return "reset"
    return "read to its end" if tail.endswith(END_OF_CHUNKED_BODY) else "still streaming"


def attack_process(
    plan: AttackPlan, stop: Event, ready: Event, results: Queue[dict[str, Any]]
) -> None:
    """The attacker process's body (``multiprocessing``'s target): run ``plan`` until
    ``stop`` is set or its own bounds end it, then put its tally on ``results``."""
    with contextlib.suppress(OSError):
        os.nice(plan.niceness)
    attack = Attack(plan, stop.is_set, ready.set)
    tally = asyncio.run(attack.run())
    results.put({"outcomes": dict(tally), "attempts": attack.attempts})
