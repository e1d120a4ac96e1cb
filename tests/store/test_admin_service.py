"""The admin service and the registry snapshot, on every store backend."""

from __future__ import annotations

import asyncio
import io
import tarfile
from datetime import datetime, timedelta, timezone
from functools import partial
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.admin import schemas
from app.admin.manifests import apply_manifests
from app.admin.service import AdminService
from app.errors import AuthenticationError, BadRequestError, ConflictError, NotFoundError
from app.quota.limits import Limits
from app.settings import EMBEDDED_MODEL_DIR
from app.store.snapshot import load_registry, revision
from app.store.tables import KeyQuotaRow
from app.tenancy.manifests import TenantManifest
from app.tenancy.storage import STORE_DIR
from bench.random_adapters import make_random_adapter

ACTOR = "admin:test"


def adapter_dir(admin: AdminService, name: str, seed: int = 1, rank: int = 8) -> Path:
    return make_random_adapter(
        EMBEDDED_MODEL_DIR,
        admin.storage.root / name,
        rank=rank,
        target_modules=("q_proj", "v_proj"),
        seed=seed,
    )


async def register(admin: AdminService, name: str, path: str) -> int:
    row = await admin.register_adapter(ACTOR, name, partial(admin.storage.from_path, path))
    return row.version


async def registry(sessions: async_sessionmaker[AsyncSession]):  # type: ignore[no-untyped-def]
    _, view = await load_registry(sessions, base_model_id="base")
    return view


async def test_tenants_crud_is_audited(admin: AdminService, changes: list[int]) -> None:
    created = await admin.create_tenant(ACTOR, schemas.TenantCreate(id="acme", name="ACME"))
    assert created.enabled and not created.allow_base_model
    with pytest.raises(ConflictError):
        await admin.create_tenant(ACTOR, schemas.TenantCreate(id="acme", name="Again"))
    updated = await admin.update_tenant(ACTOR, "acme", schemas.TenantUpdate(enabled=False))
    assert not updated.enabled and updated.name == "ACME"
    assert [t.id for t in await admin.list_tenants()] == ["acme"]
    await admin.delete_tenant(ACTOR, "acme")
    with pytest.raises(NotFoundError):
        await admin.get_tenant("acme")
    entries_page = await admin.audit_page(limit=10)
    entries, next_offset = entries_page.items, entries_page.next_offset
    assert [(e.action, e.outcome) for e in entries] == [
        ("tenant.delete", "ok"),
        ("tenant.update", "ok"),
        ("tenant.create", "rejected"),
        ("tenant.create", "ok"),
    ]
    assert next_offset is None and all(e.actor == ACTOR for e in entries)
    first = await admin.audit_page(limit=3)
    page, next_offset = first.items, first.next_offset
    assert len(page) == 3 and next_offset == 3
    assert len(changes) == 3  # only successful mutations refresh the view


async def test_keys_are_shown_once_and_revocation_is_immediate(
    admin: AdminService, sessions: async_sessionmaker[AsyncSession]
) -> None:
    await admin.create_tenant(ACTOR, schemas.TenantCreate(id="acme", name="ACME"))
    row, key = await admin.create_key(ACTOR, "acme", schemas.KeyCreate(name="ci"))
    assert key.startswith(row.prefix) and row.sha256 not in key
    listed = await admin.list_keys("acme")
    assert [(k.id, k.prefix, k.name) for k in listed] == [(row.id, row.prefix, "ci")]
    assert key not in repr([vars(k) for k in listed])
    assert (await registry(sessions)).authenticate(key).key_id == row.id

    await admin.touch_keys([row.id], datetime.now(timezone.utc))
    assert (await admin.list_keys("acme"))[0].last_used_at is not None
    await admin.revoke_key(ACTOR, "acme", row.id)
    with pytest.raises(AuthenticationError):
        (await registry(sessions)).authenticate(key)
    with pytest.raises(NotFoundError):
        await admin.revoke_key(ACTOR, "other", row.id)

    soon = datetime.now(timezone.utc) + timedelta(hours=1)
    expiring, key2 = await admin.create_key(ACTOR, "acme", schemas.KeyCreate(expires_at=soon))
    view = await registry(sessions)
    assert view.authenticate(key2).key_id == expiring.id
    with pytest.raises(AuthenticationError, match="expired"):
        view.authenticate(key2, now=soon)
    with pytest.raises(BadRequestError):
        past = datetime.now(timezone.utc) - timedelta(seconds=1)
        await admin.create_key(ACTOR, "acme", schemas.KeyCreate(expires_at=past))


async def test_adapter_versions_grants_and_deletion(
    admin: AdminService, sessions: async_sessionmaker[AsyncSession]
) -> None:
    adapter_dir(admin, "src-a", seed=1)
    adapter_dir(admin, "src-b", seed=2, rank=16)
    assert await register(admin, "legal", "src-a") == 1
    assert await register(admin, "legal", "src-a") == 1  # same content: same version
    assert await register(admin, "legal", "src-b") == 2
    versions = await admin.list_adapter_versions("legal")
    assert [(v.version, v.rank) for v in versions] == [(1, 8), (2, 16)]
    assert all(Path(v.path).parent == admin.storage.root / STORE_DIR for v in versions)

    await admin.create_tenant(ACTOR, schemas.TenantCreate(id="acme", name="ACME"))
    await admin.grants.put(ACTOR, "acme", "latest", schemas.GrantPut(adapter="legal"))
    await admin.grants.put(ACTOR, "acme", "pinned", schemas.GrantPut(adapter="legal", version=1))
    with pytest.raises(BadRequestError, match="no version 9") as refused:
        await admin.grants.put(ACTOR, "acme", "x", schemas.GrantPut(adapter="legal", version=9))
    assert refused.value.param == "version"
    with pytest.raises(NotFoundError):
        await admin.grants.put(ACTOR, "acme", "x", schemas.GrantPut(adapter="nope"))
    tenant = (await registry(sessions)).tenant("acme")
    assert tenant is not None
    assert tenant.grants["latest"].adapters[0].version == 2
    assert tenant.grants["pinned"].adapters[0].version == 1
    assert tenant.grants["latest"].adapters != tenant.grants["pinned"].adapters

    with pytest.raises(ConflictError, match="acme:latest"):
        await admin.delete_adapter(ACTOR, "legal", force=False)
    removed = await admin.delete_adapter(ACTOR, "legal", force=True)
    assert [r.version for r in removed] == [1, 2]
    assert await admin.grants.for_tenant("acme") == []
    await admin.forget_files(removed)
    assert not any(Path(r.path).exists() for r in removed)
    with pytest.raises(NotFoundError):
        await admin.list_adapter_versions("legal")


async def test_rejected_registrations_leave_nothing_behind(admin: AdminService) -> None:
    source = adapter_dir(admin, "bad", rank=8)
    (source / "adapter_model.bin").write_bytes(b"pickle")
    with pytest.raises(BadRequestError, match="pickle"):
        await register(admin, "bad", "bad")
    with pytest.raises(BadRequestError, match="relative"):
        await register(admin, "escape", "../../etc")

    archive = admin.storage.root.parent / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("../outside.txt")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    with pytest.raises(BadRequestError):
        await admin.register_adapter(
            ACTOR, "evil", partial(admin.storage.from_archive, archive, "evil.tar.gz")
        )
    assert list((admin.storage.root / STORE_DIR).iterdir()) == []
    assert not (admin.storage.root.parent / "outside.txt").exists()
    entries_page = await admin.audit_page(limit=10)
    entries, _ = entries_page.items, entries_page.next_offset
    assert [e.outcome for e in entries] == ["rejected"] * 3


async def test_uploaded_archive_becomes_a_version(admin: AdminService, tmp_path: Path) -> None:
    source = adapter_dir(admin, "upload-src", seed=5)
    archive = tmp_path / "adapter.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source, arcname="my-adapter")
    row = await admin.register_adapter(
        ACTOR, "uploaded", partial(admin.storage.from_archive, archive, "adapter.tar.gz")
    )
    assert (row.name, row.version, row.rank) == ("uploaded", 1, 8)
    assert sorted(p.name for p in Path(row.path).iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]


async def test_manifests_apply_idempotently_and_prune(
    admin: AdminService, sessions: async_sessionmaker[AsyncSession]
) -> None:
    adapter_dir(admin, "legal")
    await register(admin, "legal", "legal")
    await admin.create_tenant(ACTOR, schemas.TenantCreate(id="stale", name="Stale"))
    manifests = [
        TenantManifest(id="acme", name="ACME", adapters={"lawyer": "legal"}),
        TenantManifest(id="off", name="Off", enabled=False, allow_base_model=True),
    ]
    first = await apply_manifests(admin, ACTOR, manifests)
    assert "created tenant acme" in first and "granted acme:lawyer -> legal" in first
    assert await apply_manifests(admin, ACTOR, manifests) == []
    before = await revision(sessions)
    assert await apply_manifests(admin, ACTOR, manifests, prune=True) == ["deleted tenant stale"]
    assert await revision(sessions) > before
    view = await registry(sessions)
    off = view.tenant("off")
    assert off is not None and not off.enabled and off.allow_base_model
    acme = view.tenant("acme")
    assert acme is not None and set(acme.grants) == {"lawyer"}


async def test_splits_roll_back_in_one_call_and_hold_their_versions(
    admin: AdminService, sessions: async_sessionmaker[AsyncSession]
) -> None:
    for seed in (1, 2, 3):
        adapter_dir(admin, f"v{seed}", seed=seed)
        assert await register(admin, "support", f"v{seed}") == seed
    await admin.create_tenant(ACTOR, schemas.TenantCreate(id="acme", name="ACME"))
    split = schemas.GrantPut(adapter="support", versions={1: 90, 2: 10}, sticky="user")
    with pytest.raises(BadRequestError, match="no version 7, 9") as refused:
        await admin.grants.put(
            ACTOR, "acme", "support", schemas.GrantPut(adapter="support", versions={7: 1, 9: 1})
        )
    assert refused.value.param == "versions"
    await admin.grants.put(ACTOR, "acme", "support", split)
    grant = (await registry(sessions)).tenant("acme").grants["support"]
    assert grant.sticky and [(w.adapter.version, w.weight) for w in grant.versions] == [
        (1, 90),
        (2, 10),
    ]

    with pytest.raises(ConflictError, match="acme:support"):
        await admin.delete_adapter_version(ACTOR, "support", 2)
    removed = await admin.delete_adapter_version(ACTOR, "support", 3)  # in no grant
    assert removed.version == 3
    with pytest.raises(NotFoundError):
        await admin.delete_adapter_version(ACTOR, "support", 3)

    row = await admin.grants.roll_back(ACTOR, "acme", "support", 1)
    assert (row.version, row.weights) == (1, None)
    assert row.rolled_back is not None
    assert row.rolled_back["replaced"] == "support {v1: 90, v2: 10} sticky per user"
    grant = (await registry(sessions)).tenant("acme").grants["support"]
    assert [w.adapter.version for w in grant.versions] == [1]
    entries_page = await admin.audit_page(limit=1)
    entries, _ = entries_page.items, entries_page.next_offset
    assert (entries[0].action, entries[0].target, entries[0].detail) == (
        "grant.rollback",
        "acme/support",
        "to v1",
    )
    with pytest.raises(BadRequestError, match="no version 3"):
        await admin.grants.roll_back(ACTOR, "acme", "support", 3)

    # The manifest puts the split back, and says it overwrote the rollback.
    manifest = TenantManifest(
        id="acme",
        name="ACME",
        adapters={"support": {"adapter": "support", "versions": {1: 90, 2: 10}, "sticky": "user"}},
    )
    (change,) = await apply_manifests(admin, ACTOR, [manifest])
    assert change.startswith(
        "granted acme:support -> support {v1: 90, v2: 10} sticky per user "
        "(overwrites the rollback to v1 of "
    )
    assert await apply_manifests(admin, ACTOR, [manifest]) == []
    (out,) = await admin.grants.for_tenant("acme")
    assert out.rolled_back is None and out.weights == {"1": 90, "2": 10}


async def test_quota_settings_round_trip(admin: AdminService) -> None:
    await admin.create_tenant(ACTOR, schemas.TenantCreate(id="acme", name="ACME"))
    assert await admin.get_quota("acme") is None
    body = schemas.QuotaPut(requests_per_minute=60, token_budget=1000, budget_period="day")
    row = await admin.put_quota(ACTOR, "acme", body)
    assert (row.requests_per_minute, row.token_budget, row.budget_period) == (60, 1000, "day")
    with pytest.raises(BadRequestError, match="budget_period"):
        await admin.put_quota(ACTOR, "acme", schemas.QuotaPut(token_budget=5))


async def test_key_quotas_reach_the_snapshot_and_go_with_their_tenant(
    admin: AdminService, sessions: async_sessionmaker[AsyncSession]
) -> None:
    await admin.create_tenant(ACTOR, schemas.TenantCreate(id="acme", name="ACME"))
    await admin.create_tenant(ACTOR, schemas.TenantCreate(id="other", name="Other"))
    row, key = await admin.create_key(ACTOR, "acme", schemas.KeyCreate())
    with pytest.raises(NotFoundError):
        await admin.put_key_quota(ACTOR, "other", row.id, schemas.QuotaPut(requests_per_minute=1))
    await admin.put_key_quota(ACTOR, "acme", row.id, schemas.QuotaPut(max_concurrent_requests=3))
    principal = (await registry(sessions)).authenticate(key)
    assert principal.key.limits == Limits(max_concurrent=3)
    assert principal.tenant.limits.unlimited

    await admin.delete_key_quota(ACTOR, "acme", row.id)
    assert (await registry(sessions)).authenticate(key).key.limits.unlimited
    await admin.put_key_quota(ACTOR, "acme", row.id, schemas.QuotaPut(requests_per_minute=9))
    await admin.delete_tenant(ACTOR, "acme")
    async with sessions() as session:
        assert await session.get(KeyQuotaRow, row.id) is None


async def test_version_ids_are_never_reused(admin: AdminService) -> None:
    # The id keys vLLM's weight cache: a reused id would serve stale weights.
    adapter_dir(admin, "a", seed=1)
    adapter_dir(admin, "b", seed=2)
    first = await admin.register_adapter(ACTOR, "x", partial(admin.storage.from_path, "a"))
    await admin.delete_adapter(ACTOR, "x", force=False)
    second = await admin.register_adapter(ACTOR, "x", partial(admin.storage.from_path, "b"))
    assert second.id > first.id and second.version == 1


async def test_migrations_match_the_tables(sessions: async_sessionmaker[AsyncSession]) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from app.store.tables import Base

    def diff(connection):  # type: ignore[no-untyped-def]
        return compare_metadata(MigrationContext.configure(connection), Base.metadata)

    async with sessions() as session:
        connection = await session.connection()
        assert await connection.run_sync(diff) == []


async def test_a_reserved_adapter_name_is_refused_before_anything_is_stored(
    admin: AdminService,
) -> None:
    adapter_dir(admin, "residency")
    with pytest.raises(BadRequestError) as caught:
        await register(admin, "residency", "residency")
    assert caught.value.param == "name"
    store = admin.storage.root / STORE_DIR
    assert not store.exists() or not any(store.iterdir())


async def test_a_path_through_a_symlink_loop_is_refused(admin: AdminService) -> None:
    admin.storage.root.mkdir(parents=True, exist_ok=True)
    (admin.storage.root / "a").symlink_to("b")
    (admin.storage.root / "b").symlink_to("a")
    with pytest.raises(BadRequestError, match="cannot be resolved"):
        await register(admin, "looped", "a/adapter")


async def test_scheduling_attributes_round_trip(
    admin: AdminService, sessions: async_sessionmaker[AsyncSession]
) -> None:
    plain = await admin.create_tenant(ACTOR, schemas.TenantCreate(id="plain", name="Plain"))
    assert (plain.weight, plain.priority) == (1, "interactive")
    assert (plain.slo_ttft_ms, plain.slo_tpot_ms) == (0, 0)  # its class's objectives
    heavy = schemas.TenantCreate(
        id="heavy", name="Heavy", weight=3, priority="batch", slo_ttft_ms=9000
    )
    await admin.create_tenant(ACTOR, heavy)
    await admin.update_tenant(ACTOR, "plain", schemas.TenantUpdate(weight=5, slo_tpot_ms=80))
    read = await admin.get_tenant("plain")
    assert (read.weight, read.priority, read.slo_tpot_ms) == (5, "interactive", 80)
    view = await registry(sessions)
    assert (view.tenant("plain").weight, view.tenant("plain").priority) == (5, "interactive")
    assert (view.tenant("heavy").weight, view.tenant("heavy").priority) == (3, "batch")
    assert (view.tenant("plain").slo_ttft_ms, view.tenant("plain").slo_tpot_ms) == (0, 80)
    assert (view.tenant("heavy").slo_ttft_ms, view.tenant("heavy").slo_tpot_ms) == (9000, 0)


async def test_manifests_set_and_reset_scheduling_attributes(
    admin: AdminService, sessions: async_sessionmaker[AsyncSession]
) -> None:
    weighted = TenantManifest(
        id="acme", name="ACME", weight=4, priority="batch", slo_ttft_ms=3000, slo_tpot_ms=150
    )
    assert await apply_manifests(admin, ACTOR, [weighted]) == ["created tenant acme"]
    tenant = (await registry(sessions)).tenant("acme")
    assert (tenant.weight, tenant.priority) == (4, "batch")
    assert (tenant.slo_ttft_ms, tenant.slo_tpot_ms) == (3000, 150)
    # A manifest that no longer names them puts the defaults back.
    plain = TenantManifest(id="acme", name="ACME")
    assert await apply_manifests(admin, ACTOR, [plain]) == ["updated tenant acme"]
    tenant = (await registry(sessions)).tenant("acme")
    assert (tenant.weight, tenant.priority) == (1, "interactive")
    assert (tenant.slo_ttft_ms, tenant.slo_tpot_ms) == (0, 0)


async def test_a_rollback_rule_fires_once_however_many_replicas_race(
    admin: AdminService, sessions: async_sessionmaker[AsyncSession]
) -> None:
    for seed in (1, 2):
        adapter_dir(admin, f"v{seed}", seed=seed)
        await register(admin, "support", f"v{seed}")
    await admin.create_tenant(ACTOR, schemas.TenantCreate(id="acme", name="ACME"))
    rule = {"to": 1, "error_rate": 0.1}
    with pytest.raises(ValueError, match="needs a split"):
        schemas.GrantPut(adapter="support", version=1, rollback=rule)
    with pytest.raises(ValueError, match=r"`rollback.to` \(3\) is not a version of the split"):
        schemas.GrantPut(adapter="support", versions={1: 1, 2: 1}, rollback={**rule, "to": 3})
    split = schemas.GrantPut(adapter="support", versions={1: 50, 2: 50}, rollback=rule)
    await admin.grants.put(ACTOR, "acme", "support", split)
    grant = (await registry(sessions)).tenant("acme").grants["support"]
    assert grant.rollback is not None and grant.rollback.window_seconds == 300

    # Every replica found v2 failing at once; one of them rolls the split back.
    won = await asyncio.gather(
        *(
            admin.grants.roll_back_by_rule("acme", "support", "v2 failed", judged=grant.revision)
            for _ in range(4)
        )
    )
    assert sorted(won) == [False, False, False, True]
    entries_page = await admin.audit_page(limit=10)
    entries, _ = entries_page.items, entries_page.next_offset
    assert [(e.actor, e.action, e.detail) for e in entries if e.action == "grant.rollback"] == [
        ("rollback-rule", "grant.rollback", "v2 failed")
    ]
    (row,) = await admin.grants.for_tenant("acme")
    assert (row.version, row.weights, row.rollback) == (1, None, None)
    assert row.rolled_back is not None and row.rolled_back["reason"] == "v2 failed"
