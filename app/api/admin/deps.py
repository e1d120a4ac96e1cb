"""Admin authentication: bearer tokens from settings, compared in constant time.

The dependencies are coroutines although nothing in them awaits: FastAPI runs a plain function
in its thread pool, a hop that costs more than the function."""

from __future__ import annotations

import hashlib
from typing import Annotated

from fastapi import Depends, Request

from app.admin.service import AdminService
from app.api.deps import GatewayDep, bearer_token, matches_any
from app.errors import AuthenticationError

INVALID_ADMIN_TOKEN = "Invalid admin token."


def actor_name(token: str) -> str:
    """The audit name of an admin token: a hash prefix, never the token."""
    return "admin:" + hashlib.sha256(token.encode()).hexdigest()[:12]


async def admin_actor(request: Request, gateway: GatewayDep) -> str:
    """The audit name of the calling admin token; 401 unless it is one."""
    token = bearer_token(request)
    if token is None or not matches_any(token, gateway.admin_tokens):
        raise AuthenticationError(INVALID_ADMIN_TOKEN)
    return actor_name(token)


async def admin_service(gateway: GatewayDep) -> AdminService:
    return gateway.admin


AdminActor = Annotated[str, Depends(admin_actor)]
Admin = Annotated[AdminService, Depends(admin_service)]
