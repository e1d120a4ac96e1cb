"""Dependencies shared by the routes, as ``Annotated`` aliases."""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from typing import Annotated

from fastapi import Depends, Request

from app.gateway import Gateway
from app.tenancy.tenants import Principal

# The dependencies are coroutines: FastAPI runs a plain `def` dependency on its thread pool,
# a thread hop per dependency per request for work that never blocks (attribute reads, and
# for the key a hash and dictionary lookups in the in-memory registry).


async def get_gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


GatewayDep = Annotated[Gateway, Depends(get_gateway)]


def parse_bearer(authorization: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, if it is one."""
    scheme, _, token = authorization.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def bearer_token(request: Request) -> str | None:
    return parse_bearer(request.headers.get("authorization", ""))


def matches_any(token: str | None, accepted: Iterable[str]) -> bool:
    """Whether ``token`` is one of ``accepted``, compared in constant time: every
    accepted token is compared, so the time taken says nothing about which one matched."""
    given = (token or "").encode()
    matches = [hmac.compare_digest(given, candidate.encode()) for candidate in accepted]
    return bool(given) and any(matches)


async def authenticate(request: Request, gateway: GatewayDep) -> Principal:
    return gateway.authenticate(bearer_token(request))


CurrentPrincipal = Annotated[Principal, Depends(authenticate)]


async def request_id(request: Request) -> str:
    rid: str = request.state.request_id
    return rid


RequestId = Annotated[str, Depends(request_id)]
