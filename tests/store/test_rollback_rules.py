"""The automatic rollback rule, on every store backend: it judges the grant it read (its
adapter, from its last change on), counts only the failures that are the version's, and
rolls back only that grant."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.admin import schemas
from app.admin.rollouts import apply_rollback_rules
from app.admin.service import AdminService
from app.usage import UsageLedger, UsageRecord
from tests.store.test_admin_service import ACTOR, adapter_dir, register, registry

ALIAS = "assist"
RULE = {"to": 1, "error_rate": 0.4, "min_requests": 3}
_ids = itertools.count()


def now() -> datetime:
    return datetime.now(timezone.utc)


async def two_adapters(admin: AdminService) -> None:
    """``support`` and ``other``, each with versions 1 and 2; the tenant ``acme``."""
    for name, seed in (("support", 1), ("other", 3)):
        for version in (1, 2):
            adapter_dir(admin, f"{name}{version}", seed=seed + version)
            await register(admin, name, f"{name}{version}")
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
