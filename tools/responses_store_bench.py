"""What ``store: true`` adds to a Responses request's latency, on SQLite and on PostgreSQL.

``python -m tools.responses_store_bench`` serves the real app (routes, admission, quotas, ledger,
the Responses path and its store) over a scripted engine, on a thread of its own, and sends
``POST /v1/responses`` from ``--concurrency`` (64) clients at a time. The engine writes
``--tokens`` (32) tokens, one every ``--step-ms`` (30 ms), as a busy engine decodes: a request
takes about a second, and the gateway is not the bottleneck (an engine that answers at once
makes 64 clients queue on the gateway's CPU, and any work added to a request, stored or not,
then adds 64 times its cost to every latency). Each round sends ``--requests`` with ``store: false``
and then as many with ``store: true``; the rounds alternate so that the machine's drift falls on
both alike. The store is a SQLite file, then a throwaway PostgreSQL cluster started from the
server binaries on the machine (as the store tests do).

It also times the store write alone (``"alone"``): ``ResponseStore.save`` of a typical
response, ``--concurrency`` at once, ``--rounds`` x 10 times, on the same store with nothing
else running: the figure the machine's noise disturbs least.

For each backend it prints, as JSON, the p50 and p99 of the requests' latency with and without
the store (milliseconds, measured by the client), the p99 added (the difference), the p50 and
p99 of the one wait ``store: true`` adds to a request in the app, the room check before it
runs (``Files.check_room``, the tenant's storage cap, as the requests awaited it), and those of
the group commits that write the responses after they are answered (``store_write``, each
batch's insert, which no request waits for). ``loop_lag`` is how late the gateway's event loop
ran a 10 ms timer meanwhile (p50 and p99): every wait on the store is at least one turn of a
loop that late. The target (issue #51) is at most 5 ms added at p99 on each backend.

``--room-check N --store PATH`` times the storage cap's room check alone instead
(``FileStore.storage_room``, what every ``store: true`` request awaits first): the SQLite file
``PATH`` is filled, through ``ResponseStore.save``, until one tenant has ``N`` stored responses
(a later run on the same file reuses them), then checked ``--checks`` times, one after another.
It prints the p50, min and max in milliseconds. It runs on any checkout that has both stores
(``PYTHONPATH=<checkout> python <this file> ...``), to compare two side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, select

from app.store.db import open_database
from app.store.files import FileStore
from app.store.responses import ResponseStore, StoredResponse
from app.store.tables import StoredResponseRow
from tests.support.harness import RunningApp, app_settings, scripted, serve_on_thread
from tests.support.scripted_engine import ScriptedEngine
from tools.gateway_cost.server import write_tiny_model
from tools.rollback_check_bench import postgres_server

TENANT = "bench"


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        "p50_ms": round(statistics.median(values), 2),
        "p99_ms": round(percentile(values, 0.99), 2),
    }


class Timed:
    """Wraps ``owner``'s coroutine method ``name``: how long each call took, in milliseconds."""

    def __init__(self, owner: object, name: str) -> None:
        self.durations: list[float] = []
        call: Callable[..., Awaitable[None]] = getattr(owner, name)

        async def timed(*args: Any, **kwargs: Any) -> None:
            started = time.perf_counter()
            try:
                await call(*args, **kwargs)
            finally:
                self.durations.append((time.perf_counter() - started) * 1000)

        setattr(owner, name, timed)


class LoopLag:
    """How late ``loop`` runs a timer of ``TICK`` seconds, in milliseconds, while it runs."""

    TICK = 0.01

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.lags: list[float] = []
        self._probe = asyncio.run_coroutine_threadsafe(self._run(), loop)

    async def _run(self) -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(self.TICK)
            self.lags.append((time.perf_counter() - started - self.TICK) * 1000)

    def stop(self) -> None:
        self._probe.cancel()


async def _requests(
    base_url: str,
    key: str,
    model: str,
    count: int,
    args: argparse.Namespace,
    store: bool,
) -> list[float]:
    """``count`` creates, ``args.concurrency`` at a time; each one's latency in milliseconds."""
    tokens, concurrency, step_seconds = args.tokens, args.concurrency, args.step_ms / 1000
    body = {"model": model, "input": "Say hi", "max_output_tokens": tokens, "store": store}
    latencies: list[float] = []
    remaining = iter(range(count))
    # Idle connections are dropped before the server's keep-alive timeout (uvicorn's 5 s) can
    # close one under a request being sent on it.
    limits = httpx.Limits(
        max_connections=concurrency, max_keepalive_connections=concurrency, keepalive_expiry=1.0
    )
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, limits=limits, timeout=300
    ) as client:

        async def worker(start: float) -> None:
            await asyncio.sleep(start)
            for _ in remaining:
                started = time.perf_counter()
                answer = await client.post("/v1/responses", json=body)
                latencies.append((time.perf_counter() - started) * 1000)
                if answer.status_code != 200:
                    raise RuntimeError(f"{answer.status_code}: {answer.text}")

        # Staggered over one request's engine time, so that they do not all finish at once.
        spread = tokens * step_seconds / concurrency
        await asyncio.gather(*(worker(n * spread) for n in range(concurrency)))
    return latencies


def _typical(response_id: str) -> StoredResponse:
    """A short exchange: a user message in, a message of about 100 tokens out."""
    text = {"type": "output_text", "text": "word " * 100, "annotations": []}
    message = {"id": "msg_out", "type": "message", "role": "assistant", "content": [text]}
    usage = {"input_tokens": 20, "output_tokens": 100, "total_tokens": 120}
    asked = {"type": "input_text", "text": "Say hi"}
    return StoredResponse(
        id=response_id,
        model="base",
        adapter=None,
        adapter_version=None,
        body={
            "id": response_id,
            "object": "response",
            "status": "completed",
            "output": [message],
            "usage": usage,
        },
        input_items=[{"id": "msg_in", "type": "message", "role": "user", "content": [asked]}],
        context=[],
    )


async def _saves_alone(database_url: str, args: argparse.Namespace) -> dict[str, float]:
    async with open_database(database_url) as sessions:
        store = ResponseStore(sessions, timedelta(days=30))
        durations: list[float] = []
        count = 0

        async def save() -> None:
            nonlocal count
            count += 1
            started = time.perf_counter()
            await store.save("bench", _typical(f"resp_{count}"))
            durations.append((time.perf_counter() - started) * 1000)

        try:
            for wave in range(1 + args.rounds * 10):
                if wave == 1:
                    durations.clear()  # the first wave warmed the pool, untimed
                await asyncio.gather(*(save() for _ in range(args.concurrency)))
        finally:
            await store.close()
    return {**summary(durations), "count": len(durations)}


async def _room_checks(store_path: Path, responses: int, checks: int) -> dict[str, Any]:
    """The room check timed ``checks`` times with the tenant holding ``responses``."""
    async with open_database(f"sqlite+aiosqlite:///{store_path}") as sessions:
        async with sessions() as session:
            held = await session.scalar(select(func.count()).select_from(StoredResponseRow)) or 0
        store = ResponseStore(sessions, timedelta(days=30))
        try:
            while held < responses:
                wave = range(held, min(responses, held + 256))  # one group commit each
                await asyncio.gather(*(store.save(TENANT, _typical(f"resp_{n}")) for n in wave))
                held = wave.stop
        finally:
            await store.close()
        files = FileStore(sessions, timedelta(days=30), 1 << 40)
        _, used = await files.storage_room(TENANT, TENANT)  # warm: the pool, the pages
        durations: list[float] = []
        for _ in range(checks):
            started = time.perf_counter()
            await files.storage_room(TENANT, TENANT)
            durations.append((time.perf_counter() - started) * 1000)
    return {
        "responses": held,
        "used_bytes": used,
        "checks": checks,
        "p50_ms": round(statistics.median(durations), 3),
        "min_ms": round(min(durations), 3),
        "max_ms": round(max(durations), 3),
    }


@contextmanager
def _served(
    state: Path, model_dir: Path, database_url: str | None, step_seconds: float
) -> Iterator[tuple[RunningApp, asyncio.AbstractEventLoop]]:
    overrides: dict[str, Any] = {"model": str(model_dir)}
    if database_url is not None:
        overrides["database_url"] = database_url
    settings = app_settings(state, **overrides)
    engine = ScriptedEngine(last_finish_reason="stop", step_seconds=step_seconds)
    with serve_on_thread(settings, scripted(engine)) as served:
        yield served


def run_backend(
    name: str, database_url: str | None, model_dir: Path, args: argparse.Namespace
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="lgw-responses-alone-") as alone:
        url = database_url or f"sqlite+aiosqlite:///{alone}/gateway.db"
        saves_alone = asyncio.run(_saves_alone(url, args))
    with (
        tempfile.TemporaryDirectory(prefix="lgw-responses-bench-") as state,
        _served(Path(state), model_dir, database_url, args.step_ms / 1000) as (running, loop),
    ):
        tenant = {"id": TENANT, "name": "Bench", "allow_base_model": True}
        asyncio.run(running.admin("POST", "/tenants", tenant))
        key = asyncio.run(running.admin("POST", f"/tenants/{TENANT}/keys", {"name": "k"}))
        model = running.gateway.registry.base_model_id
        saves = Timed(running.gateway.responses._inserter, "insert")
        room_checks = Timed(running.gateway.files, "check_room")
        latencies: dict[bool, list[float]] = {False: [], True: []}

        def send(count: int, store: bool) -> list[float]:
            return asyncio.run(_requests(running.base_url, key["key"], model, count, args, store))

        # Warm both paths (connections, the store's pool, caches), untimed.
        for store in (False, True):
            send(args.concurrency, store)
        saves.durations.clear()
        room_checks.durations.clear()
        lag = LoopLag(loop)
        for _ in range(args.rounds):
            for store in (False, True):
                latencies[store] += send(args.requests, store)
        lag.stop()
    without, with_store = summary(latencies[False]), summary(latencies[True])
    return {
        "backend": name,
        "concurrency": args.concurrency,
        "requests_each": len(latencies[True]),
        "engine": {"tokens": args.tokens, "step_ms": args.step_ms},
        "store_false": without,
        "store_true": with_store,
        "p99_added_ms": round(with_store["p99_ms"] - without["p99_ms"], 2),
        "room_check": {**summary(room_checks.durations), "count": len(room_checks.durations)},
        "store_write": {**summary(saves.durations), "batches": len(saves.durations)},
        "loop_lag": summary(lag.lags),
        "alone": saves_alone,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=640, help="per mode and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=32, help="each request's output")
    parser.add_argument("--step-ms", type=float, default=30.0, help="the engine's pace")
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--room-check", type=int, metavar="N", help="see the module")
    parser.add_argument("--store", type=Path, help="--room-check's SQLite file")
    parser.add_argument("--checks", type=int, default=200, help="--room-check's checks")
    args = parser.parse_args()
    if args.room_check is not None:
        if args.store is None:
            parser.error("--room-check needs --store")
        timed = asyncio.run(_room_checks(args.store, args.room_check, args.checks))
        print(json.dumps({**timed, "machine": platform.platform()}))
        return
    with tempfile.TemporaryDirectory(prefix="lgw-tiny-model-") as models:
        model_dir = write_tiny_model(Path(models) / "tiny-model")
        machine = {"machine": platform.platform(), "python": platform.python_version()}
        if args.backend in ("sqlite", "both"):
            print(json.dumps({**run_backend("sqlite", None, model_dir, args), **machine}))
        if args.backend in ("postgresql", "both"):
            with postgres_server() as url:
                print(json.dumps({**run_backend("postgresql", url, model_dir, args), **machine}))


if __name__ == "__main__":
    main()
