"""Admin authentication: bearer tokens from settings, compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated

from fastapi import Depends, Request

from app.admin.service import AdminService
from app.api.deps import GatewayDep, bearer_token
from app.errors import AuthenticationError


def admin_actor(request: Request, gateway: GatewayDep) -> str:
    """The audit name of the calling admin token (a hash prefix, never the token)."""
    token = (bearer_token(request) or "").encode()
    matches = [hmac.compare_digest(token, t.encode()) for t in gateway.admin_tokens]
    if not token or not any(matches):
        raise AuthenticationError("Invalid admin token.")
    return "admin:" + hashlib.sha256(token).hexdigest()[:12]


def admin_service(gateway: GatewayDep) -> AdminService:
    return gateway.admin


AdminActor = Annotated[str, Depends(admin_actor)]
Admin = Annotated[AdminService, Depends(admin_service)]
