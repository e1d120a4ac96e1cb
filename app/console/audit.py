"""The audit log, newest first, filtered by actor, action and time, a page at a time."""

from __future__ import annotations

from datetime import datetime, timezone

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from app.admin.queries import AuditFilter
from app.api.deps import GatewayDep
from app.console.auth import Session
from app.console.rendering import ConsoleRoute, page
from app.errors import BadRequestError
from app.protocol import INT64_MAX

router = APIRouter(route_class=ConsoleRoute)

PAGE_SIZE = 50


def _moment(value: str, field: str) -> datetime | None:
    """A ``datetime-local`` input's value, read as UTC (the console shows every time in UTC)."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value).replace(tzinfo=timezone.utc)
    except ValueError:
        raise BadRequestError(f"`{field}`: not a date and time.", param=field) from None


@router.get("/audit")
async def audit(
    request: Request,
    session: Session,
    gateway: GatewayDep,
    actor: str = Query("", max_length=64),
    action: str = Query("", max_length=64),
    since: str = Query("", max_length=32),
    until: str = Query("", max_length=32),
    offset: int = Query(0, ge=0, le=INT64_MAX),
) -> Response:
    where = AuditFilter(
        actor=actor or None,
        action=action or None,
        since=_moment(since, "since"),
        until=_moment(until, "until"),
    )
    listed = await gateway.admin.audit_page(where, offset, PAGE_SIZE)
    filters = {"actor": actor, "action": action, "since": since, "until": until}
    return page(request, "audit.html", session, listed=listed, filters=filters)
