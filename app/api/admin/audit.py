"""``/admin/v1/audit``: every admin mutation, newest first."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.admin import schemas
from app.api.admin.deps import Admin
from app.protocol import INT64_MAX

router = APIRouter(prefix="/audit", tags=["admin: audit"])


@router.get("", response_model=schemas.AuditPage)
async def list_audit(
    admin: Admin,
    offset: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> object:
    rows, next_offset = await admin.list_audit(offset, limit)
    return schemas.AuditPage(
        data=[schemas.AuditOut.model_validate(r, from_attributes=True) for r in rows],
        next_offset=next_offset,
    )
