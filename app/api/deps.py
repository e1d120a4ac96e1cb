"""Dependencies shared by the routes, as ``Annotated`` aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.gateway import Gateway
from app.tenancy.models import Principal


def get_gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


GatewayDep = Annotated[Gateway, Depends(get_gateway)]


def bearer_token(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def authenticate(request: Request, gateway: GatewayDep) -> Principal:
    return gateway.authenticate(bearer_token(request))


CurrentPrincipal = Annotated[Principal, Depends(authenticate)]


def request_id(request: Request) -> str:
    rid: str = request.state.request_id
    return rid


RequestId = Annotated[str, Depends(request_id)]
