"""The route class of the completion endpoints, the gateway's hot path: FastAPI's declaration
(the OpenAPI schema, the body's model and its validation, its error's shape), served without
FastAPI's per-request dependency machinery.

A completion endpoint takes exactly ``(body, gateway, principal, request_id)``, as declared
with :mod:`app.api.deps`, and perhaps ``http``, the request itself; :class:`GenerationRoute`
resolves them itself, in FastAPI's order (the body read and parsed as JSON, the key
authenticated, then the body validated against its model) and with FastAPI's errors, and
calls the endpoint. Solving the dependency tree per
request cost more than all that it resolves.
"""

from __future__ import annotations

import email.message
import json
from collections.abc import Awaitable, Callable
from inspect import signature
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.api.deps import bearer_token
from app.api.errors import PRECHECKED

PARAMETERS = ("body", "gateway", "principal", "request_id")
WITH_REQUEST = (*PARAMETERS, "http")
MISSING_BODY = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}


def _json_content(content_type: str) -> bool:
    """Whether FastAPI would parse a body of ``content_type`` as JSON."""
    if content_type == "application/json":
        return True
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


async def _read_body(request: Request) -> Any:
    """The body as FastAPI's route reads it: JSON where the content type says so (a body that
    is not JSON is its ``json_invalid`` error), else the bytes (which its model refuses);
    ``None`` when empty."""
    try:
        raw = await request.body()
        if not raw:
            return None
        content_type = request.headers.get("content-type")
        if content_type is None or not _json_content(content_type):
            return raw
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        error = {
            "type": "json_invalid",
            "loc": ("body", exc.pos),
            "msg": "JSON decode error",
            "input": {},
            "ctx": {"error": exc.msg},
        }
        raise RequestValidationError([error], body=exc.doc) from exc
    except HTTPException:
        raise
    except Exception as exc:  # the body could not be read: as FastAPI answers it
        raise HTTPException(status_code=400, detail="There was an error parsing the body") from exc


class GenerationRoute(APIRoute):
    """An :class:`APIRoute` whose endpoint takes ``(body, gateway, principal, request_id)``
    (and perhaps ``http``), served by :meth:`serve` rather than FastAPI's request handler."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        parameters = tuple(signature(endpoint).parameters)
        assert parameters in (PARAMETERS, WITH_REQUEST), endpoint
        assert self.body_field is not None
        self._call: Callable[..., Awaitable[Response]] = endpoint
        self._takes_request = parameters == WITH_REQUEST
        self.app = self.serve

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Resolve the endpoint's arguments, call it and send its response; a refusal is
        raised to the app's error handlers, as FastAPI's would be."""
        request = Request(scope, receive, send)
        raw = await _read_body(request)
        gateway = scope["app"].state.gateway
        # The key the early refusal authenticated for its precheck, the same request's.
        principal = scope["state"].get(PRECHECKED) or gateway.authenticate(bearer_token(request))
        assert self.body_field is not None
        if raw is None:  # empty, or JSON's null
            errors: list[Any] = [MISSING_BODY]
        else:
            body, errors = self.body_field.validate(raw, {}, loc=("body",))
        if errors:
            raise RequestValidationError(errors, body=raw)
        arguments = {"http": request} if self._takes_request else {}
        response = await self._call(
            body=body,
            gateway=gateway,
            principal=principal,
            request_id=scope["state"]["request_id"],
            **arguments,
        )
        await response(scope, receive, send)
