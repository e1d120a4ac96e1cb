"""Every failure leaves as OpenAI's error shape, never FastAPI's default ``detail``."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from app.errors import BadRequestError, GatewayError

logger = logging.getLogger(__name__)


def render(exc: GatewayError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status_code, headers=exc.headers)


def _param(loc: tuple[int | str, ...]) -> str | None:
    # ("body", "messages", 0, "role") -> "messages.0.role"
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or None


async def _gateway_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GatewayError)
    return render(exc)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0]
    param = _param(tuple(first.get("loc", ())))
    message = first.get("msg", "Invalid request.")
    if first.get("type") == "json_invalid":
        message = "We could not parse the JSON body of your request."
    elif param:
        message = f"Invalid value for '{param}': {message}"
    return render(BadRequestError(message, param=param))


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    error = GatewayError(str(exc.detail))
    error.status_code = exc.status_code
    error.error_type = "invalid_request_error" if exc.status_code < 500 else "server_error"
    if exc.status_code == 404:
        error.message = f"Unknown request URL: {request.method} {request.url.path}."
    return render(error)


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unhandled error on %s %s", request.method, request.url.path)
    return render(GatewayError("The server had an error while processing your request."))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
