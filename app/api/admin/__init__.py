"""The admin REST API, ``/admin/v1``: every route needs an admin token."""

from fastapi import APIRouter, Depends

from app.api.admin import adapters, audit, grants, keys, quotas, residency, tenants, usage
from app.api.admin.deps import admin_actor
from app.protocol import ERROR_RESPONSES

router = APIRouter(
    prefix="/admin/v1", dependencies=[Depends(admin_actor)], responses=ERROR_RESPONSES
)
# residency before adapters: /adapters/residency is not an adapter named "residency".
for module in (tenants, keys, grants, quotas, usage, residency, adapters, audit):
    router.include_router(module.router)
