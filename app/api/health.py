"""Probes: ``/healthz`` (the process answers) and ``/readyz`` (the engine serves)."""

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
        await gateway.engine.check_health()
    except EngineUnavailableError as exc:
        detail = gateway.startup_error or exc.message
        return JSONResponse({"status": "unavailable", "detail": detail}, status_code=503)
    return JSONResponse({"status": "ready"})
