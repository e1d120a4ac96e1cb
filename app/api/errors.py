"""Every failure leaves as OpenAI's error shape, never FastAPI's default ``detail``.

On admin routes, a refusal by validation (400) and a server error (500) are
audited here unless the admin service has already audited it.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError
from starlette._utils import get_route_path
from starlette.exceptions import HTTPException
from starlette.routing import Match, Route

from app.admin.mutations import was_audited
from app.api.admin.failure_audit import is_admin_path, record_admin_failure
from app.errors import BadRequestError, GatewayError, StoreUnavailableError
from app.store.db import store_is_down

logger = logging.getLogger(__name__)

# Set in a request's state once the request-size limit has cut its body off: the
# middleware that did so answers (413) and audits it.
BODY_CUT_OFF = "body_cut_off"
# Set in a completion request's state, to its principal, once its rate limits were checked
# before its body was read.
PRECHECKED = "prechecked"


def render(exc: GatewayError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status_code, headers=exc.headers)


async def _audit_admin(request: Request, status_code: int, detail: str) -> None:
    path = get_route_path(request.scope)
    cut_off = request.scope.get("state", {}).get(BODY_CUT_OFF, False)
    if not is_admin_path(path) or cut_off or (status_code != 400 and status_code < 500):
        return
    outcome = "rejected" if status_code < 500 else "error"
    gateway = getattr(request.app.state, "gateway", None)
    await record_admin_failure(gateway, request.scope, path, outcome, detail)


def _param(loc: tuple[int | str, ...]) -> str | None:
    # ("body", "messages", 0, "role") -> "messages.0.role"
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or None


async def _gateway_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GatewayError)
    if not was_audited(exc):
        await _audit_admin(request, exc.status_code, exc.message)
    return render(exc)


def validation_refusal(exc: RequestValidationError) -> BadRequestError:
    """The 400 for a request its route's declared parameters refuse, naming the first
    refused field (the console shows the same refusal as a page)."""
    first = exc.errors()[0]
    param = _param(tuple(first.get("loc", ())))
    message = first.get("msg", "Invalid request.")
    if first.get("type") == "json_invalid":
        message = "We could not parse the JSON body of your request."
    elif param:
        message = f"Invalid value for '{param}': {message}"
    return BadRequestError(message, param=param)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    refusal = validation_refusal(exc)
    await _audit_admin(request, 400, refusal.message)
    principal = request.scope.get("state", {}).get(PRECHECKED)
    if principal is not None:
        # Parsing the body was work done for the tenant: it counts as a request.
        await request.app.state.gateway.tracker.charge_refused(principal)
    return render(refusal)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    # Starlette's own headers stay: a 405's `Allow` (RFC 9110 requires it), a 401's
    # `WWW-Authenticate`.
    error = GatewayError(str(exc.detail), headers=dict(exc.headers or {}))
    if exc.status_code == 405:
        error.headers["Allow"] = _allowed_methods(request)
    error.status_code = exc.status_code
    error.error_type = "invalid_request_error" if exc.status_code < 500 else "server_error"
    if exc.status_code == 404:
        error.message = f"Unknown request URL: {request.method} {request.url.path}."
    await _audit_admin(request, error.status_code, error.message)
    return render(error)


def _allowed_methods(request: Request) -> str:
    # Starlette's Allow names the methods of the first route whose path matched; a path
    # served by several routes (GET and POST /admin/v1/tenants) takes all of theirs.
    methods: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, Route) and route.matches(request.scope)[0] != Match.NONE:
            methods |= route.methods or set()
    return ", ".join(sorted(methods))


async def _store_error(request: Request, exc: Exception) -> JSONResponse:
    if not store_is_down(exc):
        return await _unexpected_error(request, exc)
    logger.error("the store failed on %s %s: %s", request.method, request.url.path, exc)
    await _audit_admin(request, 503, f"store unavailable: {type(exc).__name__}")
    return render(StoreUnavailableError("The gateway's store is unavailable; retry shortly."))


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unhandled error on %s %s", request.method, request.url.path)
    # The exception's text stays in the log: it may hold anything.
    await _audit_admin(request, 500, f"unhandled {type(exc).__name__}")
    return render(GatewayError("The server had an error while processing your request."))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    # The database cannot serve now (unreachable, starting up...): a retryable 503, not a 500.
    for unreachable in (DBAPIError, ConnectionError):
        app.add_exception_handler(unreachable, _store_error)
    app.add_exception_handler(Exception, _unexpected_error)
