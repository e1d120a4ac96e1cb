"""``/admin/v1/tenants/{id}/adapters/{alias}``: what a tenant may call, by which name."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from app.admin import schemas
from app.api.admin.deps import Admin, AdminActor
from app.api.deps import GatewayDep
from app.store.tables import GrantRow

router = APIRouter(prefix="/tenants/{tenant_id}/adapters", tags=["admin: grants"])


def _out(row: GrantRow, gateway: GatewayDep) -> schemas.GrantOut:
    tenant = gateway.registry.tenant(row.tenant_id)
    adapter = tenant.adapters.get(row.alias) if tenant else None
    return schemas.GrantOut(
        tenant_id=row.tenant_id,
        alias=row.alias,
        adapter=row.adapter_name,
        version=row.version,
        resolved_version=adapter.version if adapter else None,
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
    return _out(await admin.put_grant(actor, tenant_id, alias, body), gateway)


@router.get("", response_model=list[schemas.GrantOut])
async def list_grants(tenant_id: str, admin: Admin, gateway: GatewayDep) -> object:
    return [_out(row, gateway) for row in await admin.list_grants(tenant_id)]


@router.delete("/{alias}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_grant(tenant_id: str, alias: str, admin: Admin, actor: AdminActor) -> Response:
    await admin.delete_grant(actor, tenant_id, alias)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
