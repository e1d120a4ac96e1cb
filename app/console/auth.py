"""Who may use the console: a signed-in session on every page, its CSRF token on every
mutation, and sign-in attempts limited per address and audited."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.admin.sessions import ConsoleSession
from app.api.deps import GatewayDep

SESSION_COOKIE = "lgw_console"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"


class NotSignedIn(Exception):
    """No live session: a page redirects to the sign-in form, a mutation is refused."""


class CsrfRefused(Exception):
    """A mutation without its session's CSRF token, or from another origin."""


async def console_session(request: Request, gateway: GatewayDep) -> ConsoleSession:
    session = await gateway.console_sessions.find(
        request.cookies.get(SESSION_COOKIE), gateway.admin_tokens
    )
    if session is None:
        raise NotSignedIn()
    return session


Session = Annotated[ConsoleSession, Depends(console_session)]


def same_origin(request: Request) -> bool:
    """Whether the request's ``Origin`` (where the browser sends one) is the console's own."""
    origin = request.headers.get("origin")
    return origin is None or origin == f"{request.url.scheme}://{request.url.netloc}"


async def mutation_session(request: Request, session: Session) -> ConsoleSession:
    """The session, once the request carries its CSRF token (a form field, or a header from
    the console's script) and comes from the console's origin. The session is checked
    before the body is read: an upload is refused unread without one."""
    presented = request.headers.get(CSRF_HEADER)
    if presented is None:
        field = (await request.form()).get(CSRF_FIELD)
        presented = field if isinstance(field, str) else None
    if not (same_origin(request) and session.check_csrf(presented)):
        raise CsrfRefused()
    return session


Mutation = Annotated[ConsoleSession, Depends(mutation_session)]
