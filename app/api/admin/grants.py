"""``/admin/v1/tenants/{id}/adapters/{alias}``: what a tenant may call, by which name."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from app.admin import schemas
from app.admin.rollouts import version_stats
from app.api.admin.deps import Admin, AdminActor
from app.api.deps import GatewayDep
from app.store.tables import GrantRow

router = APIRouter(prefix="/tenants/{tenant_id}/adapters", tags=["admin: grants"])


def _out(row: GrantRow, gateway: GatewayDep) -> schemas.GrantOut:
    tenant = gateway.registry.tenant(row.tenant_id)
    grant = tenant.grants.get(row.alias) if tenant else None
    return schemas.GrantOut(
        tenant_id=row.tenant_id,
        alias=row.alias,
        **row.spec().model_dump(),
        resolved_version=(grant.adapters[0].version if grant and not row.weights else None),
        rolled_back=row.rolled_back,
    )


@router.put("/{alias}", response_model=schemas.GrantOut)
async def put_grant(
    tenant_id: str,
    alias: str,
    body: schemas.GrantPut,
    admin: Admin,
    actor: AdminActor,
    gateway: GatewayDep,
) -> object:
    schemas.check_grant_alias(alias, gateway.registry.base_model_id)
    return _out(await admin.grants.put(actor, tenant_id, alias, body), gateway)


@router.post("/{alias}/rollback", response_model=schemas.GrantOut)
async def rollback_grant(
    tenant_id: str,
    alias: str,
    body: schemas.GrantRollback,
    admin: Admin,
    actor: AdminActor,
    gateway: GatewayDep,
) -> object:
    """All of the alias's traffic to one version of its adapter, at once (audited); a split
    in place is replaced, and remembered in ``rolled_back``."""
    return _out(await admin.grants.roll_back(actor, tenant_id, alias, body.version), gateway)


@router.get("/{alias}/versions", response_model=schemas.VersionComparison)
async def compare_versions(
    tenant_id: str,
    alias: str,
    admin: Admin,
    gateway: GatewayDep,
    window_seconds: Annotated[int, Query(ge=60, le=31 * 86_400)] = 3600,
) -> object:
    """The alias's versions side by side over the last ``window_seconds``, from the usage
    ledger (every replica's requests): requests, errors, finish reasons, TTFT, inter-token
    latency and completion length (each version's percentiles are of its latest 10,000
    requests); of the adapter the alias is granted now (none where it is not granted)."""
    tenant = await admin.get_tenant(tenant_id)  # 404 for an unknown tenant
    await gateway.ledger.flush()  # include what finished a moment ago
    since = datetime.now(timezone.utc) - timedelta(seconds=window_seconds)
    granted = {row.alias: row.adapter_name for row in await admin.grants.for_tenant(tenant_id)}
    adapter = granted.get(alias)
    stats = (
        []
        if adapter is None
        else await version_stats(gateway.sessions, tenant.uid, alias, since, adapter=adapter)
    )
    return schemas.VersionComparison(
        tenant_id=tenant_id,
        alias=alias,
        since=since,
        versions=[schemas.VersionStatsOut.model_validate(s.summary()) for s in stats],
    )


@router.get("", response_model=list[schemas.GrantOut])
async def list_grants(tenant_id: str, admin: Admin, gateway: GatewayDep) -> object:
    return [_out(row, gateway) for row in await admin.grants.for_tenant(tenant_id)]


@router.delete("/{alias}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_grant(tenant_id: str, alias: str, admin: Admin, actor: AdminActor) -> Response:
    await admin.grants.delete(actor, tenant_id, alias)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
