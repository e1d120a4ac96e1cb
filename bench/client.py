"""The streaming client, open loop and closed loop.

Open loop: one asyncio task per request, started on schedule whether or not
earlier requests have answered, so a system that falls behind builds a queue
(and shows it in its latencies) instead of silently slowing the offered load.

Closed loop: a fixed number of clients, each sending its next request as soon
as its last one finished: the system's throughput at that concurrency.

TTFT is the time to the first chunk that carries generated text (not the
role-only opening chunk; see ``bench.events``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from bench.events import StreamTiming, sse_data
from bench.workload import PlannedRequest

CHAT_PATH = "/v1/chat/completions"
MAX_RETRY_AFTER_SECONDS = 30.0


@dataclass(frozen=True)
class Call:
    """How one system is asked for one planned request."""

    model: str
    api_key: str | None
    extra_body: dict[str, Any] = field(default_factory=dict)


@dataclass
class RequestRecord:
    """One request as the client saw it; times in seconds from the workload's start."""

    system: str
    point: str
    index: int
    tenant: int
    model: str
    scheduled: float
    started: float = 0.0
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    e2e: float | None = None
    output_tokens: int = 0
    prompt_tokens: int | None = None
    status: int | None = None
    retry_after: float | None = None  # seconds, from a 429's Retry-After
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def request_body(planned: PlannedRequest, call: Call) -> dict[str, Any]:
    return {
        "model": call.model,
        "messages": [{"role": "user", "content": planned.prompt}],
        "max_tokens": planned.max_tokens,
        # Greedy, and exactly max_tokens: both systems do the same work for a request.
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        **call.extra_body,
    }


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


async def _one(
    client: httpx.AsyncClient,
    planned: PlannedRequest,
    call: Call,
    record: RequestRecord,
    clock: Callable[[], float],
) -> None:
    headers = {"Authorization": f"Bearer {call.api_key}"} if call.api_key else {}
    timing = StreamTiming()
    record.started = clock()
    try:
        async with client.stream(
            "POST", CHAT_PATH, json=request_body(planned, call), headers=headers
        ) as response:
            record.status = response.status_code
            if response.status_code == 429:
                record.retry_after = _seconds(response.headers.get("retry-after"))
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                record.error = f"HTTP {response.status_code}: {body[:200]}"
                return
            async for line in response.aiter_lines():
                payload = sse_data(line)
                if payload is not None:
                    timing.feed(payload, clock())
        if timing.error is None and not timing.done:
            timing.error = "stream ended without [DONE]"
    except (httpx.HTTPError, OSError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    except asyncio.CancelledError:
        record.error = "not finished before the drain deadline"
    finally:
        end = clock()
        record.error = record.error or timing.error
        record.output_tokens = timing.output_tokens
        record.prompt_tokens = timing.prompt_tokens
        if timing.token_times:
            record.ttft = timing.token_times[0] - record.started
        record.itl = timing.gaps()
        record.e2e = end - record.started


async def run_workload(
    base_url: str,
    system: str,
    point: str,
    requests: Sequence[PlannedRequest],
    call_for: Callable[[PlannedRequest], Call],
    *,
    drain_seconds: float,
    on_finished: Callable[[RequestRecord], None] = lambda record: None,
    until: asyncio.Event | None = None,
) -> tuple[list[RequestRecord], float]:
    """Send ``requests`` on schedule; return their records and the run's wall time.

    The wall time runs from the workload's start to the last answer (or the
    drain deadline, ``drain_seconds`` after the last arrival, when requests
    still run then: they are cancelled and count as errors). ``until``: once it
    is set, no further request is sent (those sent still run to their end), and
    only the requests sent have records.
    """
    async with _client(base_url) as client:
        start = time.perf_counter()

        def clock() -> float:
            return time.perf_counter() - start

        records: list[RequestRecord] = []
        tasks: list[asyncio.Task[None]] = []
        for planned in requests:
            delay = planned.at - clock()
            if delay > 0:
                if until is None:
                    await asyncio.sleep(delay)
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(until.wait(), delay)
            if until is not None and until.is_set():
                break
            call = call_for(planned)
            record = RequestRecord(
                system, point, planned.index, planned.tenant, call.model, planned.at
            )
            records.append(record)
            task = asyncio.create_task(_one(client, planned, call, record, clock))
            task.add_done_callback(lambda _, record=record: on_finished(record))  # type: ignore[misc]
            tasks.append(task)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=drain_seconds)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        finished = [r.started + r.e2e for r in records if r.e2e is not None]
        wall = max(finished, default=clock())
    return records, wall


def _client(base_url: str) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(connect=10.0, read=None, write=10.0, pool=None)
    return httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout)


class ClosedLoop:
    """``concurrency`` clients working through ``requests`` (or cycling through
    them until stopped), each sending its next request when its last one ended.

    Records appear in the order requests were sent; times are seconds from
    ``start``. ``stop`` cancels whatever is still running: the client hangs up,
    as a user would, and those records say so.
    """

    CANCELLED = "cancelled when the loop stopped"

    def __init__(
        self,
        base_url: str,
        system: str,
        point: str,
        requests: Sequence[PlannedRequest],
        call_for: Callable[[PlannedRequest], Call],
        *,
        concurrency: int,
        cycle: bool = False,
        on_finished: Callable[[RequestRecord], None] = lambda record: None,
    ) -> None:
        if concurrency < 1 or not requests:
            raise ValueError("a closed loop needs a client and a request")
        self.base_url, self.system, self.point = base_url, system, point
        self.call_for = call_for
        self.concurrency = concurrency
        self.records: list[RequestRecord] = []
        self.on_finished = on_finished
        self._next: Iterator[PlannedRequest] = (
            itertools.cycle(requests) if cycle else iter(requests)
        )
        self._sent = 0
        self._stopping = False
        self._workers: list[asyncio.Task[None]] = []
        self._http: httpx.AsyncClient | None = None
        self._start = 0.0

    def clock(self) -> float:
        return time.perf_counter() - self._start

    async def _worker(self, http: httpx.AsyncClient) -> None:
        while not self._stopping:
            planned = next(self._next, None)
            if planned is None:
                return
            call = self.call_for(planned)
            record = RequestRecord(
                self.system, self.point, self._sent, planned.tenant, call.model, self.clock()
            )
            self._sent += 1
            self.records.append(record)
            await _one(http, planned, call, record, self.clock)
            if self._stopping and record.error == "not finished before the drain deadline":
                record.error = self.CANCELLED
            self.on_finished(record)
            if record.status == 429 and not self._stopping:
                # Turned away: come back when the server says, as a client that
                # honours Retry-After does, rather than spin on refusals.
                await asyncio.sleep(min(record.retry_after or 1.0, MAX_RETRY_AFTER_SECONDS))

    def start(self) -> None:
        self._http = _client(self.base_url)
        self._start = time.perf_counter()
        self._workers = [
            asyncio.create_task(self._worker(self._http)) for _ in range(self.concurrency)
        ]

    async def wait(self, timeout: float | None) -> bool:
        """Wait until every request has ended; False if ``timeout`` came first."""
        _, pending = await asyncio.wait(self._workers, timeout=timeout)
        return not pending

    async def stop(self) -> float:
        """Cancel what still runs, close the connections; the loop's wall time."""
        self._stopping = True
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        if self._http is not None:
            await self._http.aclose()
        finished = [r.started + r.e2e for r in self.records if r.e2e is not None]
        return max(finished, default=self.clock())


async def run_closed_loop(
    base_url: str,
    system: str,
    point: str,
    requests: Sequence[PlannedRequest],
    call_for: Callable[[PlannedRequest], Call],
    *,
    concurrency: int,
    timeout_seconds: float,
    on_finished: Callable[[RequestRecord], None] = lambda record: None,
) -> tuple[list[RequestRecord], float]:
    """Run ``requests`` at ``concurrency``; their records and the wall time from the
    first request sent to the last answer. Requests not answered within
    ``timeout_seconds`` are cancelled, and those never sent are recorded too,
    all as errors."""
    loop = ClosedLoop(
        base_url, system, point, requests, call_for,
        concurrency=concurrency, on_finished=on_finished,
    )  # fmt: skip
    loop.start()
    finished = await loop.wait(timeout_seconds)
    wall = await loop.stop()
    records = loop.records
    if not finished:
        for record in records:
            if record.error == ClosedLoop.CANCELLED:
                record.error = "not finished before the deadline"
        for planned in requests[len(records) :]:
            record = RequestRecord(system, point, len(records), planned.tenant, "-", wall)
            record.error = "not sent before the deadline"
            records.append(record)
    return records, wall
