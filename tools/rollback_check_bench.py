"""What one automatic-rollback check costs with a large ledger, on SQLite and PostgreSQL.

``python -m tools.rollback_check_bench --rows 1000000`` fills a fresh store (a SQLite file, and
a throwaway PostgreSQL cluster started from the server binaries on the machine, as the store
tests do) with ``--rows`` usage records of one alias's split, all within its rule's one-day
window (the worst case: every row is the judged alias's), written through the usage ledger as
a replica writes them. Then, on each backend, it times:

- ``check``: ``apply_rollback_rules`` (what every replica runs every 5 s), ``--checks`` times;
- ``loop lag``: how late a 1 ms timer fires on the event loop, p99, while idle and while the
  checks run back to back (``/healthz`` waits for the loop just as long);
- ``comparison``: ``version_stats`` over the same day (the versions endpoint), once;
- ``per-row read`` (``--baseline``): the per-row read the check used to make (every row of
  the window into Python, on the event loop), once, with its loop lag.

It prints one JSON object per backend.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.admin.rollouts import apply_rollback_rules, version_stats
from app.admin.service import AdminService
from app.settings import EMBEDDED_MODEL_DIR
from app.store.db import open_database
from app.store.tables import UsageRow
from app.tenancy.adapters import Adapter
from app.tenancy.base_model import BaseModelInfo
from app.tenancy.grants import Grant, RollbackRule, Weighted
from app.tenancy.registry import TenantRegistry
from app.tenancy.storage import LocalAdapterStore
from app.tenancy.tenants import Tenant
from app.usage import UsageLedger, UsageRecord

ALIAS, ADAPTER, UID = "assist", "support", "bench-tenant"
WINDOW = 86_400
BATCH = 20_000


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _pg_bin(name: str) -> str:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    return str(found[-1]) if found else name


def _as_postgres(command: list[str]) -> list[str]:
    # initdb and postgres refuse to run as root.
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@contextmanager
def postgres_server() -> Iterator[str]:
    """A throwaway PostgreSQL cluster on a free loopback port, and its database's URL."""
    data = Path(tempfile.mkdtemp(prefix="lgw-bench-pg-"))
    if os.geteuid() == 0:
        shutil.chown(data, "postgres", "postgres")
    port = _free_port()
    initdb = [_pg_bin("initdb"), "-D", str(data / "db"), "-U", "postgres", "-A", "trust"]
    subprocess.run(_as_postgres([*initdb, "--no-sync"]), check=True, capture_output=True)
    options = f"-p {port} -k {data} -c listen_addresses=127.0.0.1"
    pg_ctl = [_pg_bin("pg_ctl"), "-D", str(data / "db"), "-l", str(data / "log"), "-o", options]
    subprocess.run(_as_postgres([*pg_ctl, "-w", "start"]), check=True, capture_output=True)
    try:
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(_as_postgres([*pg_ctl, "-m", "immediate", "stop"]), capture_output=True)
        shutil.rmtree(data, ignore_errors=True)


def _registry(changed_at: datetime) -> TenantRegistry:
    """One tenant whose alias splits ``support`` v1 and v2, back to v1 above 5% errors."""
    versions = tuple(
        Weighted(Adapter(ADAPTER, v, "0" * 64, Path("/nonexistent"), 8, ("q_proj",), v), 50)
        for v in (1, 2)
    )
    rule = RollbackRule(to=1, error_rate=0.05, window_seconds=WINDOW, min_requests=50)
    grant = Grant(versions, rollback=rule, changed_at=changed_at, revision=1)
    tenant = Tenant(id="acme", name="ACME", grants={ALIAS: grant}, uid=UID)
    return TenantRegistry([tenant], [], base_model_id="base")


async def _fill(sessions: async_sessionmaker[AsyncSession], rows: int, start: datetime) -> None:
    """``rows`` requests spread over the day after ``start``; 1% failed by their version."""
    ledger = UsageLedger(sessions, backlog_max=BATCH + 1)
    step = WINDOW / rows
    for first in range(0, rows, BATCH):
        for i in range(first, min(rows, first + BATCH)):
            started = start + timedelta(seconds=i * step)
            failed = i % 100 == 0
            ledger.record(
                UsageRecord(
                    request_id=f"bench-{i}",
                    tenant_id="acme",
                    tenant_uid=UID,
                    key_id="k",
                    endpoint="chat.completions",
                    model=ALIAS,
                    adapter=ADAPTER,
                    adapter_version=1 + i % 2,
                    prompt_tokens=40,
                    completion_tokens=16,
                    status="error" if failed else "ok",
                    latency_ms=300,
                    started_at=started,
                    finished_at=started,
                    finish_reason=None if failed else "stop",
                    ttft_ms=50 + i % 200,
                    itl_ms=20.0 + i % 7,
                    fault="version" if failed else None,
                )
            )
        await ledger.flush()


@asynccontextmanager
async def _lag() -> AsyncIterator[list[float]]:
    """How late (ms) each 1 ms timer fired on the event loop while the block ran."""
    late: list[float] = []
    stop = asyncio.Event()

    async def tick() -> None:
        while not stop.is_set():
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            late.append((time.perf_counter() - before) * 1000 - 1)

    ticker = asyncio.create_task(tick())
    try:
        yield late
    finally:
        stop.set()
        await ticker


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


async def _timed(work: Callable[[], Awaitable[Any]]) -> float:
    began = time.perf_counter()
    await work()
    return (time.perf_counter() - began) * 1000


async def _per_row_read(sessions: async_sessionmaker[AsyncSession], since: datetime) -> int:
    """The check as it was: every row of the window into Python."""
    query = select(
        UsageRow.adapter_version,
        UsageRow.status,
        UsageRow.finish_reason,
        UsageRow.ttft_ms,
        UsageRow.itl_ms,
        UsageRow.completion_tokens,
    ).where(UsageRow.tenant_uid == UID, UsageRow.model == ALIAS, UsageRow.started_at >= since)
    errors = 0
    async with sessions() as session:
        for _version, status, _finish, _ttft, _itl, _completion in await session.execute(query):
            errors += status == "error"
    return errors


async def measure(url: str, rows: int, checks: int, baseline: bool) -> dict[str, Any]:
    now = datetime.now(timezone.utc)
    start = now - timedelta(seconds=WINDOW - 60)
    registry = _registry(changed_at=start - timedelta(minutes=1))
    async with open_database(url) as sessions:
        began = time.perf_counter()
        await _fill(sessions, rows, start)
        filled_s = time.perf_counter() - began
        storage = LocalAdapterStore(
            Path(tempfile.mkdtemp(prefix="lgw-bench-adapters-")),
            BaseModelInfo.from_model_dir(EMBEDDED_MODEL_DIR),
            max_rank=32,
            max_bytes=1 << 20,
        )

        async def nothing() -> None:
            return None

        admin = AdminService(sessions, storage, on_change=nothing)

        async def check() -> None:
            assert await apply_rollback_rules(admin, sessions, registry, now) == []

        await check()  # warm: connections, statement caches
        async with _lag() as idle:
            await asyncio.sleep(2)
        times = []
        async with _lag() as during:
            for _ in range(checks):
                times.append(await _timed(check))
        result: dict[str, Any] = {
            "backend": url.split("+")[0],
            "rows": rows,
            "fill_s": round(filled_s, 1),
            "check_ms": {
                "median": round(statistics.median(times), 2),
                "p95": _p(times, 0.95),
                "max": round(max(times), 2),
                "n": checks,
            },
            "loop_lag_p99_ms": {"idle": _p(idle, 0.99), "during_checks": _p(during, 0.99)},
            "comparison_ms": round(
                await _timed(
                    lambda: version_stats(
                        sessions, UID, ALIAS, now - timedelta(seconds=WINDOW), adapter=ADAPTER
                    )
                ),
                1,
            ),
        }
        if baseline:
            async with _lag() as old:
                old_ms = await _timed(lambda: _per_row_read(sessions, start))
            result["per_row_read"] = {"ms": round(old_ms, 1), "loop_lag_max_ms": round(max(old), 1)}
    return result


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--checks", type=int, default=50)
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--baseline", action="store_true", help="also time the per-row read")
    args = parser.parse_args()
    machine = f"{platform.node()} ({os.cpu_count()} CPUs, {platform.processor() or '?'})"
    print(json.dumps({"machine": machine, "date": datetime.now(timezone.utc).isoformat()}))
    if args.backend in ("sqlite", "both"):
        folder = Path(tempfile.mkdtemp(prefix="lgw-bench-sqlite-"))
        try:
            url = f"sqlite+aiosqlite:///{folder / 'store.db'}"
            print(json.dumps(await measure(url, args.rows, args.checks, args.baseline)))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    if args.backend in ("postgresql", "both"):
        with postgres_server() as url:
            print(json.dumps(await measure(url, args.rows, args.checks, args.baseline)))


if __name__ == "__main__":
    asyncio.run(main())
