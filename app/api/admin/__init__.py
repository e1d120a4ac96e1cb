"""The admin REST API, ``/admin/v1``: every route needs an admin token."""

from fastapi import APIRouter, Depends

from app.api.admin import adapters, audit, grants, keys, quotas, tenants, usage
from app.api.admin.deps import admin_actor
from app.protocol import ERROR_RESPONSES

router = APIRouter(
    prefix="/admin/v1", dependencies=[Depends(admin_actor)], responses=ERROR_RESPONSES
)
for module in (tenants, keys, grants, quotas, usage, adapters, audit):
    router.include_router(module.router)
