"""``/admin/v1/tenants/{id}/quota``: stored here, enforced by the quota layer."""

from __future__ import annotations

from fastapi import APIRouter

from app.admin import schemas
from app.api.admin.deps import Admin, AdminActor

router = APIRouter(prefix="/tenants/{tenant_id}/quota", tags=["admin: quotas"])


@router.put("", response_model=schemas.QuotaOut)
async def put_quota(
    tenant_id: str, body: schemas.QuotaPut, admin: Admin, actor: AdminActor
) -> object:
    return await admin.put_quota(actor, tenant_id, body)


@router.get("", response_model=schemas.QuotaOut)
async def get_quota(tenant_id: str, admin: Admin) -> object:
    row = await admin.get_quota(tenant_id)
    return row if row is not None else schemas.QuotaOut(tenant_id=tenant_id)
