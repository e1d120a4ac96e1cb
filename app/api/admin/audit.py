"""``/admin/v1/audit``: every admin mutation, newest first, filtered by actor, action and
time."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.admin import schemas
from app.admin.queries import AuditFilter
from app.admin.schemas import DateTime
from app.api.admin.deps import Admin
from app.protocol import INT64_MAX

router = APIRouter(prefix="/audit", tags=["admin: audit"])


@router.get("", response_model=schemas.AuditPage)
async def list_audit(
    admin: Admin,
    offset: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    actor: Annotated[str | None, Query(max_length=64)] = None,
    action: Annotated[str | None, Query(max_length=64)] = None,
    since: Annotated[DateTime | None, Query(description="inclusive")] = None,
    until: Annotated[DateTime | None, Query(description="exclusive")] = None,
) -> object:
    where = AuditFilter(actor=actor, action=action, since=since, until=until)
    page = await admin.audit_page(where, offset, limit)
    return schemas.AuditPage(
        data=[schemas.AuditOut.model_validate(r, from_attributes=True) for r in page.items],
        next_offset=page.next_offset,
    )
