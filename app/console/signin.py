"""Signing in (an admin token for a session cookie) and out."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from app.api.admin.deps import actor_name
from app.api.admin.failure_audit import audit_refused_token
from app.api.deps import GatewayDep, matches_any
from app.console.auth import SESSION_COOKIE, Mutation, same_origin
from app.console.forms import text
from app.console.rendering import CONSOLE_PREFIX, ConsoleRoute, page

router = APIRouter(route_class=ConsoleRoute)


def _source(request: Request) -> str:
    return request.client.host if request.client else "unknown"


@router.get("/sign-in")
async def sign_in_form(request: Request) -> Response:
    return page(request, "sign_in.html", None)


@router.post("/sign-in")
async def sign_in(request: Request, gateway: GatewayDep) -> Response:
    """A session for a valid admin token. Attempts from one address are limited
    (``console_sign_ins_per_minute``); a sign-in is audited, and a wrong token is audited
    as the admin API audits one, through the same throttle (once per address a minute, 60
    a minute in all), so that guessing cannot flood the audit log."""
    source = _source(request)
    wait = request.app.state.console_sign_ins.take(source)
    if wait > 0:
        message = f"Too many sign-in attempts: try again in {int(wait) + 1} s."
        return page(request, "sign_in.html", None, status=429, error=message)
    token = text(await request.form(), "token")
    if not same_origin(request) or not matches_any(token, gateway.admin_tokens):
        if audit_refused_token(request.app.state.auth_failure_throttle, source):
            await gateway.admin.audit(
                "unauthenticated", "console.sign_in", source, "denied", "invalid admin token"
            )
        return page(request, "sign_in.html", None, status=401, error="Invalid admin token.")
    actor = actor_name(token)
    secret = await gateway.console_sessions.start(token, actor)
    await gateway.admin.audit(actor, "console.sign_in", source, "ok")
    response = RedirectResponse(f"{CONSOLE_PREFIX}/", status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        secret,
        max_age=gateway.settings.console_session_seconds,
        path=CONSOLE_PREFIX,
        httponly=True,
        samesite="strict",
        # The scheme is the client's: X-Forwarded-Proto from a trusted proxy counts.
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/sign-out")
async def sign_out(request: Request, session: Mutation, gateway: GatewayDep) -> Response:
    await gateway.console_sessions.end(session.id, "sign-out")
    await gateway.admin.audit(session.actor, "console.sign_out", _source(request), "ok")
    response = RedirectResponse(f"{CONSOLE_PREFIX}/sign-in", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path=CONSOLE_PREFIX)
    return response
