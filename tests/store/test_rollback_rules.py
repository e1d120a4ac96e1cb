"""The automatic rollback rule, on every store backend: it judges the grant it read (its
adapter, from its last change on), counts only the failures that are the version's, and
rolls back only that grant; it counts in the store, and the versions' comparison reads a
bounded number of rows, through an index."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy import Result, event
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import ORMExecuteState, Session

from app.admin import schemas
from app.admin.rollouts import apply_rollback_rules, version_stats
from app.admin.service import AdminService
from app.settings import EMBEDDED_MODEL_DIR
from app.store.db import open_database
from app.store.snapshot import load_registry
from app.tenancy.base_model import BaseModelInfo
from app.tenancy.registry import TenantRegistry
from app.tenancy.storage import LocalAdapterStore
from app.usage import UsageLedger, UsageRecord
from bench.random_adapters import make_random_adapter

ACTOR = "admin:test"
ALIAS = "assist"
RULE = {"to": 1, "error_rate": 0.4, "min_requests": 3}
_ids = itertools.count()


def now() -> datetime:
    return datetime.now(timezone.utc)


async def registry(sessions: async_sessionmaker[AsyncSession]) -> TenantRegistry:
    _, view = await load_registry(sessions, base_model_id="base")
    return view


async def two_adapters(admin: AdminService) -> None:
    """``support`` and ``other``, each with versions 1 and 2; the tenant ``acme``."""
    for name, seed in (("support", 1), ("other", 3)):
        for version in (1, 2):
            path = f"{name}{version}"
            make_random_adapter(
                EMBEDDED_MODEL_DIR,
                admin.storage.root / path,
                rank=8,
                target_modules=("q_proj", "v_proj"),
                seed=seed + version,
            )
            await admin.register_adapter(ACTOR, name, partial(admin.storage.from_path, path))
    await admin.create_tenant(ACTOR, schemas.TenantCreate(id="acme", name="ACME"))


async def put_split(admin: AdminService, adapter: str, weights: dict[int, int]) -> None:
    body = schemas.GrantPut(adapter=adapter, versions=weights, rollback=RULE)
    await admin.grants.put(ACTOR, "acme", ALIAS, body)


async def served(
    sessions: async_sessionmaker[AsyncSession],
    adapter: str,
    version: int,
    outcomes: Sequence[tuple[str, str | None]],
    *,
    at: datetime | None = None,
) -> None:
    """Write one usage record per (status, fault) in ``outcomes``: requests of ``acme``'s
    alias served by ``adapter`` v``version``, started at ``at`` (default: now)."""
    uid = (await registry(sessions)).tenant("acme").uid
    ledger = UsageLedger(sessions)
    started = at or now()
    for status, fault in outcomes:
        fields: dict[str, Any] = {"fault": fault} if fault is not None else {}
        ledger.record(
            UsageRecord(
                request_id=f"r{next(_ids)}",
                tenant_id="acme",
                tenant_uid=uid,
                key_id="k",
                endpoint="chat",
                model=ALIAS,
                adapter=adapter,
                adapter_version=version,
                prompt_tokens=3,
                completion_tokens=1,
                status=status,  # type: ignore[arg-type]
                latency_ms=5,
                started_at=started,
                finished_at=started,
                **fields,
            )
        )
    await ledger.flush()


VERSION_ERRORS = [("error", "version")] * 3


async def test_a_fresh_split_of_another_adapter_is_not_blamed_for_the_last_ones_errors(
    admin: AdminService, sessions: async_sessionmaker[AsyncSession]
) -> None:
    await two_adapters(admin)
    await put_split(admin, "support", {1: 50, 2: 50})
    await served(sessions, "support", 2, VERSION_ERRORS)
    # The alias now splits another adapter, whose v2 has served nothing yet.
    await put_split(admin, "other", {1: 50, 2: 50})

    assert await apply_rollback_rules(admin, sessions, await registry(sessions), now()) == []
    (row,) = await admin.grants.for_tenant("acme")
    assert (row.adapter_name, row.weights, row.rolled_back) == ("other", {"1": 50, "2": 50}, None)


async def test_a_rule_judges_only_what_came_after_the_grants_last_change(
    admin: AdminService, sessions: async_sessionmaker[AsyncSession]
) -> None:
    await two_adapters(admin)
    await put_split(admin, "support", {1: 50, 2: 50})
    await served(sessions, "support", 2, VERSION_ERRORS, at=now() - timedelta(seconds=1))
    # The admin shrinks v2's share after its errors: the rule starts counting afresh.
    await put_split(admin, "support", {1: 90, 2: 10})
    assert await apply_rollback_rules(admin, sessions, await registry(sessions), now()) == []

    await served(sessions, "support", 2, VERSION_ERRORS)
    rolled = await apply_rollback_rules(admin, sessions, await registry(sessions), now())
    assert rolled == [f"acme:{ALIAS}"]
    (row,) = await admin.grants.for_tenant("acme")
    assert row.version == 1 and row.rolled_back is not None
    assert row.rolled_back["reason"].startswith("v2 failed 3 of 3 requests")


async def test_a_grant_put_while_the_rule_judged_the_old_one_is_not_rolled_back(
    admin: AdminService, sessions: async_sessionmaker[AsyncSession]
) -> None:
    await two_adapters(admin)
    await put_split(admin, "support", {1: 50, 2: 50})
    await served(sessions, "support", 2, VERSION_ERRORS)
    # The rule reads the registry (the old split, its v2 failing); the admin's PUT lands
    # before the rule's update.
    judged = await registry(sessions)
    await put_split(admin, "other", {1: 50, 2: 50})

    assert await apply_rollback_rules(admin, sessions, judged, now()) == []
    (row,) = await admin.grants.for_tenant("acme")
    assert (row.adapter_name, row.weights, row.rollback, row.rolled_back) == (
        "other",
        {"1": 50, "2": 50},
        RULE | {"window_seconds": 300},
        None,
    )
    audit = (await admin.audit_page(limit=50)).items
    assert [e for e in audit if e.action == "grant.rollback"] == []
    # The grant it judged is gone; the one in place is judged afresh, and has not failed.
    assert await apply_rollback_rules(admin, sessions, await registry(sessions), now()) == []


async def test_failures_that_are_the_requests_fault_never_roll_a_split_back(
    admin: AdminService, sessions: async_sessionmaker[AsyncSession]
) -> None:
    await two_adapters(admin)
    await put_split(admin, "support", {1: 50, 2: 50})
    # A tenant's grammar that the engine gave up on, three times: its own doing.
    await served(sessions, "support", 2, [("error", "request")] * 3)
    assert await apply_rollback_rules(admin, sessions, await registry(sessions), now()) == []

    # Three engine failures: 3 of the 6 requests failed for the version (50% > 40%).
    await served(sessions, "support", 2, VERSION_ERRORS)
    rolled = await apply_rollback_rules(admin, sessions, await registry(sessions), now())
    assert rolled == [f"acme:{ALIAS}"]
    (row,) = await admin.grants.for_tenant("acme")
    assert row.rolled_back is not None
    assert row.rolled_back["reason"].startswith("v2 failed 3 of 6 requests")


@dataclass
class Read:
    """One SELECT a check ran: its SQL, the rows it handed to Python, and (on SQLite) the
    plan SQLite chose for it."""

    sql: str
    rows: int
    plan: str | None


@contextmanager
def reads() -> Iterator[list[Read]]:
    """Every SELECT run through a session while the block runs."""
    seen: list[Read] = []

    def hook(state: ORMExecuteState) -> Result[Any] | None:
        if not state.is_select:
            return None
        frozen = state.invoke_statement().freeze()
        connection = state.session.connection()
        plan = None
        if connection.dialect.name == "sqlite":
            compiled = state.statement.compile(
                dialect=connection.dialect, compile_kwargs={"literal_binds": True}
            )
            explained = connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}")
            plan = " / ".join(str(row[-1]) for row in explained)
        seen.append(Read(str(state.statement), len(frozen.data), plan))
        return frozen()

    event.listen(Session, "do_orm_execute", hook)
    try:
        yield seen
    finally:
        event.remove(Session, "do_orm_execute", hook)


async def busy_split(
    admin: AdminService, sessions: async_sessionmaker[AsyncSession], requests: int
) -> datetime:
    """The split of ``support`` under a rule, its v2 having served ``requests`` requests
    (one in 50 failed by its doing, under the rule's rate) and v1 five; when the first
    started. The v2 requests started a millisecond apart, oldest first; the oldest 2,000
    took 900 ms to a first token, the others 100 ms."""
    await two_adapters(admin)
    await put_split(admin, "support", {1: 50, 2: 50})
    first = now()
    await served(sessions, "support", 1, [("ok", None)] * 5, at=first)
    uid = (await registry(sessions)).tenant("acme").uid
    ledger = UsageLedger(sessions, backlog_max=requests + 1)
    for i in range(requests):
        failed = i % 50 == 0
        started = first + timedelta(milliseconds=i)
        ledger.record(
            UsageRecord(
                request_id=f"busy{i}",
                tenant_id="acme",
                tenant_uid=uid,
                key_id="k",
                endpoint="chat",
                model=ALIAS,
                adapter="support",
                adapter_version=2,
                prompt_tokens=3,
                completion_tokens=1,
                status="error" if failed else "ok",
                latency_ms=5,
                started_at=started,
                finished_at=started,
                fault="version" if failed else None,
                ttft_ms=900 if i < 2_000 else 100,
            )
        )
    await ledger.flush()
    return first


async def test_the_rule_check_counts_in_the_store_and_reads_no_rows(
    admin: AdminService, sessions: async_sessionmaker[AsyncSession]
) -> None:
    await busy_split(admin, sessions, 20_000)
    judged = await registry(sessions)
    with reads() as seen:
        assert (
            await apply_rollback_rules(admin, sessions, judged, now() + timedelta(minutes=2)) == []
        )
    # Counts per version come back, never the requests themselves.
    assert seen and max(read.rows for read in seen) <= 2, [(r.sql, r.rows) for r in seen]


async def test_the_comparison_counts_every_request_and_reads_at_most_10000_a_version(
    admin: AdminService, sessions: async_sessionmaker[AsyncSession]
) -> None:
    first = await busy_split(admin, sessions, 12_000)
    uid = (await registry(sessions)).tenant("acme").uid
    with reads() as seen:
        v1, v2 = await version_stats(
            sessions, uid, ALIAS, first - timedelta(seconds=1), adapter="support"
        )
    assert (v1.version, v1.requests, v2.version, v2.requests) == (1, 5, 2, 12_000)
    assert (v2.errors, v2.finish_reasons) == (240, {})
    # The percentiles are of each version's latest 10,000 requests.
    summary = v2.summary()
    assert summary["ttft_ms"] == {"p50": 100.0, "p95": 100.0, "mean": 100.0}
    assert sum(read.rows for read in seen) <= 10_000 + 5 + 10, [(r.sql, r.rows) for r in seen]


async def test_an_index_serves_every_query_of_the_check_and_the_comparison(
    tmp_path: Path, base_model: BaseModelInfo
) -> None:
    async with open_database(f"sqlite+aiosqlite:///{tmp_path / 'plans.db'}") as sessions:
        storage = LocalAdapterStore(
            tmp_path / "adapters", base_model, max_rank=32, max_bytes=64 << 20
        )
        admin = AdminService(sessions, storage, on_change=_nothing)
        first = await busy_split(admin, sessions, 100)
        uid = (await registry(sessions)).tenant("acme").uid
        judged = await registry(sessions)
        with reads() as seen:
            await apply_rollback_rules(admin, sessions, judged, now())
            await version_stats(sessions, uid, ALIAS, first, adapter="support")
    on_usage = [read for read in seen if "FROM usage" in read.sql]
    assert on_usage
    for read in on_usage:
        # Found by tenant, alias, adapter and version in an index: never a scan of the
        # tenant's whole window, nor a sort of it.
        assert read.plan is not None and "adapter_version=?" in read.plan, read.plan
        assert "SCAN usage" not in read.plan and "TEMP B-TREE FOR ORDER BY" not in read.plan


async def _nothing() -> None:
    return None
