"""The overview: is the backend serving, what went through in the last hour and day (from
the store: every replica's requests), who used most, where the adapters are."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.admin.residency_report import Residency, read_residency
from app.api.deps import GatewayDep
from app.console.auth import Session
from app.console.charts import Chart, bar_chart, series
from app.console.rendering import ConsoleRoute, page
from app.errors import GatewayError
from app.gateway import Gateway
from app.usage import top_tenants, usage_by_bucket
from app.usage.refusals import refusals_by_bucket

router = APIRouter(route_class=ConsoleRoute)


async def _charts(gateway: Gateway, label: str, *, width: int, count: int) -> list[Chart]:
    """Requests, tokens and quota refusals of every tenant in the last ``count`` buckets."""
    now = int(time.time())
    start = now // width * width - (count - 1) * width
    end = start + count * width
    totals = await usage_by_bucket(gateway.sessions, None, start=start, end=end, width=width)
    refused = await refusals_by_bucket(gateway.sessions, start=start, end=end, width=width)
    requests = {t.start: t.requests for t in totals}
    tokens = {t.start: t.prompt_tokens + t.completion_tokens for t in totals}
    return [
        bar_chart(
            f"{name}-{label}",
            f"{title}, {label}",
            series(data, start=start, width=width, count=count),
        )
        for name, title, data in (
            ("requests", "Requests", requests),
            ("tokens", "Tokens", tokens),
            ("refusals", "Quota refusals", refused),
        )
    ]


async def _residency(request: Request, gateway: Gateway) -> Counter[str] | None:
    """Registered adapter versions per tier, where the engine is in this process; ``None``
    in the front role (the engines hold that, and report it on their own /metrics)."""
    if not gateway.backends.holds_adapter_copies:
        return None
    measured = await asyncio.to_thread(read_residency, request.app.state.metrics_dir)
    versions = await gateway.admin.list_adapter_versions()
    return Counter(
        measured.get((v.name, str(v.version)), Residency()).tier or "storage" for v in versions
    )


@router.get("/")
async def overview(request: Request, session: Session, gateway: GatewayDep) -> Response:
    try:
        await gateway.check_ready()
        health = "ready"
    except GatewayError as exc:
        health = exc.message
    await gateway.ledger.flush()  # this replica's latest requests are in the charts
    now = int(time.time())
    return page(
        request,
        "overview.html",
        session,
        backend=gateway.backends.name,
        health=health,
        hour=await _charts(gateway, "last hour", width=60, count=60),
        day=await _charts(gateway, "last 24 hours", width=3600, count=24),
        top=await top_tenants(gateway.sessions, start=now - 86400, end=now + 1),
        residency=await _residency(request, gateway),
    )
