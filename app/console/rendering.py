"""Pages from Jinja2 templates (autoescaped: every tenant- or admin-supplied string is shown
as text), and the headers every console response carries."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from datetime import datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, Response
from fastapi.routing import APIRoute
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.admin.sessions import ConsoleSession
from app.api.errors import validation_refusal
from app.errors import GatewayError

CONSOLE_PREFIX = "/admin/ui"
TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"

# No inline script or style anywhere (the console's own script and sheet only), no framing,
# forms post to this origin only.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


# The section of the navigation each page belongs to.
NAV = {"tenant": "tenants", "adapter": "adapters"}


def _when(moment: datetime | None) -> str:
    return "" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _number(value: float | int | None) -> str:
    return "" if value is None else f"{value:,}"


environment = Environment(
    loader=FileSystemLoader(TEMPLATES),
    autoescape=select_autoescape(default=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
environment.filters["when"] = _when
environment.filters["number"] = _number


def page(
    request: Request,
    template: str,
    session: ConsoleSession | None,
    *,
    status: int = 200,
    **context: Any,
) -> HTMLResponse:
    """``template`` rendered for ``session`` (its actor, and the CSRF token its forms carry)."""
    section = template.removesuffix(".html")
    html = environment.get_template(template).render(
        request=request,
        session=session,
        prefix=CONSOLE_PREFIX,
        nav=NAV.get(section, section),
        **context,
    )
    return HTMLResponse(html, status_code=status)


class ConsoleHeaders:
    """Adds :data:`SECURITY_HEADERS` to every response under the console's prefix, error
    pages and static files included."""

    # It changes a response's start only: the app's streams may bypass it (StreamingApp).
    passes_bodies_through = True

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (path == CONSOLE_PREFIX or path.startswith(CONSOLE_PREFIX + "/")):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)


class ConsoleRoute(APIRoute):
    """A console route: a refusal no form of the page shows (an unknown tenant, a store that
    is down, a query or path parameter its route refuses, named as the REST API names it) is
    an error page, not the API's JSON."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def console_handler(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                refused = validation_refusal(exc)
                return page(request, "error.html", None, status=400, message=refused.message)
            except GatewayError as exc:
                return page(
                    request, "error.html", None, status=exc.status_code, message=exc.message
                )

        return console_handler
