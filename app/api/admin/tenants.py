"""``/admin/v1/tenants``"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from app.admin import schemas
from app.api.admin.deps import Admin, AdminActor
from app.protocol import INT64_MAX

router = APIRouter(prefix="/tenants", tags=["admin: tenants"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=schemas.TenantOut)
async def create_tenant(body: schemas.TenantCreate, admin: Admin, actor: AdminActor) -> object:
    return await admin.create_tenant(actor, body)


@router.get("", response_model=list[schemas.TenantOut])
async def list_tenants(
    admin: Admin,
    response: Response,
    q: Annotated[str, Query(max_length=200, description="id or name contains (any case)")] = "",
    offset: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
    limit: Annotated[int | None, Query(ge=1, le=1000, description="default: all")] = None,
) -> object:
    """Tenants by id; ``X-Total-Count`` is how many match ``q``."""
    page = await admin.tenants_page(q, offset, limit)
    response.headers["X-Total-Count"] = str(page.total)
    return page.items


@router.get("/{tenant_id}", response_model=schemas.TenantOut)
async def get_tenant(tenant_id: str, admin: Admin) -> object:
    return await admin.get_tenant(tenant_id)


@router.patch("/{tenant_id}", response_model=schemas.TenantOut)
async def update_tenant(
    tenant_id: str, body: schemas.TenantUpdate, admin: Admin, actor: AdminActor
) -> object:
    return await admin.update_tenant(actor, tenant_id, body)


@router.delete("/{tenant_id}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_tenant(tenant_id: str, admin: Admin, actor: AdminActor) -> Response:
    await admin.delete_tenant(actor, tenant_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
