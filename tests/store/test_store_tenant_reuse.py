"""A tenant id used again names a new tenant (a new uid and cache salt, no usage), whether
deleted and created again or pruned and applied again; the old tenant's usage stays its own."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.admin import schemas
from app.admin.manifests import apply_manifests
from app.admin.service import AdminService
from app.store.snapshot import load_registry
from app.tenancy.manifests import TenantManifest
from app.tenancy.tenants import Tenant
from app.usage import UsageLedger, UsageRecord, usage_totals
from tests.support.usage import record

ACTOR = "admin:test"


async def tenant(sessions: async_sessionmaker[AsyncSession], tenant_id: str) -> Tenant:
    _, view = await load_registry(sessions, base_model_id="base")
    found = view.tenant(tenant_id)
    assert found is not None
    return found


async def requests_of(sessions: async_sessionmaker[AsyncSession], tenant: Tenant) -> int:
    (total,) = await usage_totals(sessions, tenant.uid, start=None, end=None, group_by=None)
    return total.requests


def a_request(n: int, tenant: Tenant) -> UsageRecord:
    """A request of ``tenant`` that started now."""
    now = datetime.now(timezone.utc)
    made = record(n, model="base", key="k", day=now, prompt=2, completion=3)
    return replace(made, tenant_uid=tenant.uid)


def assert_another_tenant(old: Tenant, new: Tenant) -> None:
    assert new.id == old.id
    assert new.uid != old.uid
    assert new.quota_subject != old.quota_subject
    assert new.cache_salt != old.cache_salt
    assert new.id not in (new.cache_salt, old.cache_salt)


async def test_a_tenant_created_again_under_its_id_is_another_tenant(
    admin: AdminService, sessions: async_sessionmaker[AsyncSession]
) -> None:
    await admin.create_tenant(ACTOR, schemas.TenantCreate(id="acme", name="ACME"))
    old = await tenant(sessions, "acme")
    ledger = UsageLedger(sessions)
    ledger.record(a_request(1, old))
    await ledger.flush()

    await admin.delete_tenant(ACTOR, "acme")
    await admin.create_tenant(ACTOR, schemas.TenantCreate(id="acme", name="New ACME"))
    new = await tenant(sessions, "acme")

    assert_another_tenant(old, new)
    assert (await requests_of(sessions, new), await requests_of(sessions, old)) == (0, 1)


async def test_a_request_of_a_deleted_tenant_is_never_the_new_ones(
    admin: AdminService, sessions: async_sessionmaker[AsyncSession]
) -> None:
    # A request of the old tenant still running while the id is deleted and created again
    # is written after: to the old tenant.
    await admin.create_tenant(ACTOR, schemas.TenantCreate(id="acme", name="ACME"))
    old = await tenant(sessions, "acme")
    ledger = UsageLedger(sessions)
    ledger.record(a_request(1, old))

    await admin.delete_tenant(ACTOR, "acme")
    await admin.create_tenant(ACTOR, schemas.TenantCreate(id="acme", name="New ACME"))
    await ledger.flush()

    new = await tenant(sessions, "acme")
    assert (await requests_of(sessions, new), await requests_of(sessions, old)) == (0, 1)


async def test_a_tenant_pruned_and_applied_again_is_another_tenant(
    admin: AdminService, sessions: async_sessionmaker[AsyncSession]
) -> None:
    manifests = [TenantManifest(id="acme", name="ACME")]
    await apply_manifests(admin, ACTOR, manifests)
    old = await tenant(sessions, "acme")
    ledger = UsageLedger(sessions)
    ledger.record(a_request(1, old))
    await ledger.flush()

    assert await apply_manifests(admin, ACTOR, [], prune=True) == ["deleted tenant acme"]
    assert await apply_manifests(admin, ACTOR, manifests) == ["created tenant acme"]
    new = await tenant(sessions, "acme")

    assert_another_tenant(old, new)
    assert (await requests_of(sessions, new), await requests_of(sessions, old)) == (0, 1)
