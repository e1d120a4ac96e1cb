"""``/admin/v1/tenants/{id}/quota`` and ``…/keys/{key_id}/quota``: stored here, enforced by
the quota layer. A request must pass both its tenant's and its key's limits."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from app.admin import schemas
from app.api.admin.deps import Admin, AdminActor
from app.api.deps import GatewayDep
from app.errors import NotFoundError

router = APIRouter(prefix="/tenants/{tenant_id}", tags=["admin: quotas"])


@router.put("/quota", response_model=schemas.QuotaOut)
async def put_quota(
    tenant_id: str, body: schemas.TenantQuotaPut, admin: Admin, actor: AdminActor
) -> object:
    return await admin.put_quota(actor, tenant_id, body)


@router.get("/quota", response_model=schemas.QuotaOut)
async def get_quota(tenant_id: str, admin: Admin) -> object:
    row = await admin.get_quota(tenant_id)
    return row if row is not None else schemas.QuotaOut(tenant_id=tenant_id)


@router.get("/quota/usage", response_model=schemas.QuotaUsageOut)
async def get_quota_usage(tenant_id: str, gateway: GatewayDep) -> object:
    """Read from the quota store: what every replica sharing it has charged."""
    tenant = gateway.registry.tenant(tenant_id)
    if tenant is None:
        raise NotFoundError(f"No tenant `{tenant_id}`.")
    usage = await gateway.quota.usage(tenant.quota_subject, tenant.limits)
    return schemas.QuotaUsageOut(
        tenant_id=tenant_id,
        requests_per_minute_used=usage.requests,
        tokens_per_minute_used=usage.tokens,
        concurrent_requests=usage.concurrent,
        budget_used=usage.budget_used,
        budget_period=usage.budget_period,
    )


@router.put("/keys/{key_id}/quota", response_model=schemas.KeyQuotaOut)
async def put_key_quota(
    tenant_id: str, key_id: str, body: schemas.QuotaPut, admin: Admin, actor: AdminActor
) -> object:
    return await admin.put_key_quota(actor, tenant_id, key_id, body)


@router.get("/keys/{key_id}/quota", response_model=schemas.KeyQuotaOut)
async def get_key_quota(tenant_id: str, key_id: str, admin: Admin) -> object:
    row = await admin.get_key_quota(tenant_id, key_id)
    return row if row is not None else schemas.KeyQuotaOut(key_id=key_id)


@router.delete("/keys/{key_id}/quota", status_code=status.HTTP_204_NO_CONTENT)
async def delete_key_quota(
    tenant_id: str, key_id: str, admin: Admin, actor: AdminActor
) -> Response:
    await admin.delete_key_quota(actor, tenant_id, key_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
