"""``/admin/v1/adapters/residency``: each adapter version's tier, use and swap cost."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from app.admin import schemas
from app.admin.residency import Residency, read_residency
from app.api.admin.deps import Admin
from app.api.deps import GatewayDep

router = APIRouter(prefix="/adapters/residency", tags=["admin: adapters"])


@router.get("", response_model=list[schemas.AdapterResidencyOut])
async def adapter_residency(request: Request, admin: Admin, gateway: GatewayDep) -> object:
    metrics_dir = getattr(request.app.state, "metrics_dir", None)
    measured = await asyncio.to_thread(read_residency, metrics_dir)
    listed = []
    for row in await admin.list_adapter_versions():
        facts = measured.get((row.name, str(row.version)), Residency())
        listed.append(
            schemas.AdapterResidencyOut(
                name=row.name,
                version=row.version,
                tier=facts.tier or "storage",
                last_used_at=gateway.tracker.last_used.get(row.id),
                uses=facts.uses,
                hits=facts.uses["device"],
                misses=facts.uses["storage"],
                mean_swap_ms=facts.mean_swap_ms(),
            )
        )
    return listed
