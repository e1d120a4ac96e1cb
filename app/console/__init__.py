"""The admin console at ``/admin/ui/``: server-rendered pages over the admin service the REST
API uses (no second path for a mutation), signed in with an admin token for a session in
the store. No script of ours runs inline and none of anyone else's runs at all: the content
security policy allows the console's own script and style sheet only (docs/console.md)."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from app.api.routes import include_routers
from app.console import adapters, audit, overview, signin, tenants
from app.console.auth import CsrfRefused, NotSignedIn
from app.console.rendering import CONSOLE_PREFIX, STATIC, ConsoleHeaders, page
from app.quota.local_limit import LocalRateLimit
from app.settings import Settings

router = APIRouter(prefix=CONSOLE_PREFIX, include_in_schema=False)
for module in (signin, overview, tenants, adapters, audit):
    router.include_router(module.router)


async def _not_signed_in(request: Request, _: Exception) -> Response:
    if request.method in ("GET", "HEAD"):
        return RedirectResponse(f"{CONSOLE_PREFIX}/sign-in", status_code=303)
    return page(
        request, "error.html", None, status=401, message="Sign in again: your session ended."
    )


async def _csrf_refused(request: Request, _: Exception) -> Response:
    message = "Refused: the form did not come from this console. Reload the page and retry."
    return page(request, "error.html", None, status=403, message=message)


def install_console(app: FastAPI, settings: Settings) -> None:
    """Serve the console on ``app``, unless ``settings.console`` is off."""
    if not settings.console:
        return
    app.state.console_sign_ins = LocalRateLimit(settings.console_sign_ins_per_minute)
    include_routers(app, router)
    app.mount(f"{CONSOLE_PREFIX}/static", StaticFiles(directory=STATIC), name="console-static")
    app.add_exception_handler(NotSignedIn, _not_signed_in)
    app.add_exception_handler(CsrfRefused, _csrf_refused)
    app.add_middleware(ConsoleHeaders)
