"""Probes: ``/healthz`` (the process answers) and ``/readyz`` (the engine serves; in the front
role, the front has started: the store and the upstream, which every front shares, are not
asked).

``/readyz`` says whether the engine is starting, failed to start or stopped, never why: the
cause (an exception's text, with paths and versions) is in the log, not on an unauthenticated
endpoint."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.api.deps import GatewayDep
from app.errors import EngineUnavailableError

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(gateway: GatewayDep) -> JSONResponse:
    try:
        await gateway.check_ready()
    except EngineUnavailableError as exc:
        return JSONResponse({"status": "unavailable", "detail": exc.message}, status_code=503)
    return JSONResponse({"status": "ready"})
