"""Tenant manifests (``tenants/*.yaml``) applied to the store: ``lora-gateway tenants apply``."""

from __future__ import annotations

from collections.abc import Iterable

from app.admin import schemas
from app.admin.service import AdminService
from app.tenancy.manifests import TenantManifest


async def apply_manifests(
    admin: AdminService, actor: str, manifests: Iterable[TenantManifest], *, prune: bool = False
) -> list[str]:
    """Make the store match the manifests (tenants, flags, grants); idempotent.

    Keys are issued through the API, never declared, so they are left as
    they are. With ``prune``, tenants absent from the manifests are deleted.
    Returns a line per change.
    """
    changes: list[str] = []
    wanted = {m.id: m for m in manifests}
    for manifest in wanted.values():
        current = {t.id: t for t in await admin.list_tenants()}.get(manifest.id)
        if current is None:
            current = await admin.create_tenant(
                actor,
                schemas.TenantCreate(
                    id=manifest.id,
                    name=manifest.name,
                    allow_base_model=manifest.allow_base_model,
                    weight=manifest.weight,
                    priority=manifest.priority,
                    slo_ttft_ms=manifest.slo_ttft_ms,
                    slo_tpot_ms=manifest.slo_tpot_ms,
                ),
            )
            changes.append(f"created tenant {manifest.id}")
        update_ = schemas.TenantUpdate(
            name=manifest.name,
            allow_base_model=manifest.allow_base_model,
            enabled=manifest.enabled,
            weight=manifest.weight,
            priority=manifest.priority,
            slo_ttft_ms=manifest.slo_ttft_ms,
            slo_tpot_ms=manifest.slo_tpot_ms,
        )
        if any(getattr(current, f) != v for f, v in update_.model_dump(exclude_none=True).items()):
            await admin.update_tenant(actor, manifest.id, update_)
            changes.append(f"updated tenant {manifest.id}")
        grants = {g.alias: g for g in await admin.grants.for_tenant(manifest.id)}
        for alias, spec in manifest.grants().items():
            grant = grants.pop(alias, None)
            if grant is None or grant.spec() != spec or grant.rolled_back:
                await admin.grants.put(actor, manifest.id, alias, spec)
                change = f"granted {manifest.id}:{alias} -> {spec.describe()}"
                if grant is not None and grant.rolled_back:
                    rollback = grant.rolled_back
                    change += (
                        f" (overwrites the rollback to v{rollback['to']} of {rollback['at']}"
                        f" by {rollback['actor']})"
                    )
                changes.append(change)
        for alias in grants:
            await admin.grants.delete(actor, manifest.id, alias)
            changes.append(f"revoked {manifest.id}:{alias}")
    if prune:
        for tenant in await admin.list_tenants():
            if tenant.id not in wanted:
                await admin.delete_tenant(actor, tenant.id)
                changes.append(f"deleted tenant {tenant.id}")
    return changes
