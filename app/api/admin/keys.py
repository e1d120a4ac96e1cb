"""``/admin/v1/tenants/{id}/keys``: the plaintext key is in the create response only."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from app.admin import schemas
from app.api.admin.deps import Admin, AdminActor

router = APIRouter(prefix="/tenants/{tenant_id}/keys", tags=["admin: keys"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=schemas.KeyCreated)
async def create_key(
    tenant_id: str, body: schemas.KeyCreate, admin: Admin, actor: AdminActor
) -> object:
    row, key = await admin.create_key(actor, tenant_id, body)
    return schemas.KeyCreated(**schemas.KeyOut.model_validate(row).model_dump(), key=key)


@router.get("", response_model=list[schemas.KeyOut])
async def list_keys(tenant_id: str, admin: Admin) -> object:
    return await admin.list_keys(tenant_id)


@router.delete("/{key_id}", status_code=status.HTTP_204_NO_CONTENT)
async def revoke_key(tenant_id: str, key_id: str, admin: Admin, actor: AdminActor) -> Response:
    await admin.revoke_key(actor, tenant_id, key_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
