"""``/admin/v1/tenants/{id}/usage``: totals from the usage ledger."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.admin import schemas
from app.admin.schemas import DateTime
from app.api.admin.deps import Admin
from app.api.deps import GatewayDep
from app.usage import GroupBy, usage_totals

router = APIRouter(prefix="/tenants/{tenant_id}/usage", tags=["admin: usage"])


@router.get("", response_model=schemas.UsageReport)
async def tenant_usage(
    tenant_id: str,
    admin: Admin,
    gateway: GatewayDep,
    start: Annotated[DateTime | None, Query(alias="from", description="inclusive")] = None,
    end: Annotated[DateTime | None, Query(alias="to", description="exclusive")] = None,
    group_by: GroupBy | None = None,
) -> object:
    tenant = await admin.get_tenant(tenant_id)  # 404 for an unknown tenant
    await gateway.ledger.flush()  # include what finished a moment ago
    # This tenant's rows only, not those of an earlier tenant of the same id.
    totals = await usage_totals(
        gateway.sessions, tenant.uid, start=start, end=end, group_by=group_by
    )
    return schemas.UsageReport(
        tenant_id=tenant_id,
        group_by=group_by,
        data=[schemas.UsageTotalOut.model_validate(t, from_attributes=True) for t in totals],
    )
