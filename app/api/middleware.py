"""Plain ASGI middleware."""

from __future__ import annotations

from typing import ClassVar, NamedTuple

from starlette._utils import get_route_path
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import access_log, tracing
from app.access_log import AccessRecord
from app.api.admin.deps import INVALID_ADMIN_TOKEN
from app.api.admin.failure_audit import (
    AuthFailureThrottle,
    is_admin_path,
    record_admin_failure,
    record_auth_failure,
)
from app.api.deps import matches_any, parse_bearer
from app.api.errors import BODY_CUT_OFF, PRECHECKED, render
from app.errors import AuthenticationError, GatewayError, RequestTooLargeError
from app.gateway import Gateway
from app.ids import time_ordered_hex
from app.overhead import STATE as OVERHEAD_STATE
from app.overhead import RequestOverhead

REQUEST_ID_HEADER = b"x-request-id"
# Where adapter archives are uploaded: the admin API, and the console's form.
ADAPTER_UPLOAD_PATHS = frozenset({"/admin/v1/adapters", "/admin/ui/adapters"})
# Where tenants upload files (the Files API): max_file_bytes.
FILE_UPLOAD_PATH = "/v1/files"
# Room for the multipart envelope around an uploaded archive: boundaries, part
# headers and the `name` field (whose own size Starlette caps at 1 MiB).
MULTIPART_OVERHEAD_BYTES = 2 << 20
# The paths whose requests run on the engine, by the endpoint their metrics name.
GENERATION_ENDPOINTS = {
    "/v1/chat/completions": "chat.completions",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
}


class BodyLimit(NamedTuple):
    """The most a request's body may be: ``bytes`` with a multipart form's envelope, the
    refusal naming the limit as its setting has it (``stated``, ``setting``)."""

    bytes: int
    stated: int
    what: str = "The request body"
    setting: str = "max_request_bytes"
    param: str | None = None

    def refusal(self) -> RequestTooLargeError:
        return RequestTooLargeError(
            self.stated, what=self.what, param=self.param, setting=self.setting
        )


class AccessLog:
    """Writes requests' access lines (app/access_log.py); a refusal without a valid key
    (401, no tenant) only for the first from its address in each minute, as
    :class:`AuthFailureThrottle` decides: a client cycling bad keys cannot flood the log."""

    def __init__(self, throttle: AuthFailureThrottle | None = None) -> None:
        self._throttle = throttle or AuthFailureThrottle()

    def write(self, record: AccessRecord) -> None:
        unauthenticated = record.status == 401 and record.tenant is None
        if unauthenticated and not self._throttle.allow(record.client or "unknown"):
            return
        access_log.write(record.line())


class RequestIdMiddleware:
    """Gives every HTTP request an id, ``request.state.request_id``, and
    returns it in the ``x-request-id`` header of every response; writes its access line
    (``access_log``) once it has been answered, where the access log is enabled."""

    passes_bodies_through: ClassVar[bool] = True

    def __init__(self, app: ASGIApp, log: AccessLog | None = None) -> None:
        self.app = app
        self._log = log or AccessLog()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = time_ordered_hex()
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        header = (REQUEST_ID_HEADER, request_id.encode())
        if not access_log.wanted():

            async def send_with_id(message: Message) -> None:
                if message["type"] == "http.response.start":
                    message["headers"] = [*message.get("headers", []), header]
                await send(message)

            await self.app(scope, receive, send_with_id)
            return
        client = scope.get("client")
        record = AccessRecord(
            request_id, scope["method"], scope["path"], str(client[0]) if client else None
        )
        state[access_log.STATE] = record

        async def send_with_id_noted(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), header]
                record.status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id_noted)
        except Exception:
            # Answered by the server error handler, outside this middleware.
            if record.status is None:
                record.status = 500
            raise
        finally:
            self._log.write(record)


class EarlyRefusalMiddleware:
    """Refuses, before the body is read, a request the routes would refuse after
    reading it: the engine shares this process, so an unauthenticated client must
    not be able to make it read and parse hundreds of megabytes.

    * ``/v1/*`` without a valid tenant key, ``/admin/v1/*`` without an admin
      token, ``/metrics`` without the metrics token (or an admin token): the
      same 401 (or 403) the route's dependency would give. A refused admin token
      is audited (throttled) and counted. The dependencies still authenticate:
      this only answers early.
    * A completion request whose tenant (or key) is at its request-rate or
      concurrency limit: the 429 admission would give, before its body is parsed.
    * A body over its limit: 413, at once from ``Content-Length``, or as soon as
      a chunked body passes it. Adapter uploads (multipart ``POST
      /admin/v1/adapters``) have their own limit, ``max_adapter_bytes``, and so do
      tenants' files (multipart ``POST /v1/files``), ``max_file_bytes``.

    Refusals close the connection, so the server does not drain the rest of the
    body. Before the lifespan has attached a gateway, tenant and admin paths are
    left to the routes. On the dedicated metrics listener (``metrics_listener``),
    ``/metrics`` needs no credentials unless a metrics token is set, and every
    other path is left to the routes (it has none: 404).
    """

    # A body cut off at its limit is answered before the response has started.
    passes_bodies_through: ClassVar[bool] = True

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_request_bytes: int,
        max_upload_bytes: int,
        max_file_bytes: int | None = None,
        metrics_token: str | None,
        auth_failure_throttle: AuthFailureThrottle | None = None,
        metrics_listener: bool = False,
    ) -> None:
        self.app = app
        self._request_limit = BodyLimit(max_request_bytes, max_request_bytes)
        self._upload_limit = BodyLimit(
            max_upload_bytes + MULTIPART_OVERHEAD_BYTES, max_upload_bytes, "The adapter archive",
            "max_adapter_bytes", "file",
        )  # fmt: skip
        file_bytes = max_file_bytes or max_request_bytes
        self._file_limit = BodyLimit(
            file_bytes + MULTIPART_OVERHEAD_BYTES, file_bytes, "The file", "max_file_bytes", "file"
        )
        self._metrics_tokens = [metrics_token] if metrics_token else []
        self._metrics_listener = metrics_listener
        # The app's own, shared with the console's sign-in (a listener that serves no admin
        # path, such as the metrics one, needs none).
        self._throttle = auth_failure_throttle or AuthFailureThrottle()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = get_route_path(scope)
        gateway: Gateway | None = getattr(getattr(scope.get("app"), "state", None), "gateway", None)
        request_trace = None
        if gateway is not None and path in GENERATION_ENDPOINTS:
            settings = gateway.settings
            overhead = RequestOverhead(settings.role, header=settings.overhead_header)
            state = scope.setdefault("state", {})
            request_trace = tracing.start(
                overhead, scope["headers"], GENERATION_ENDPOINTS[path], state.get("request_id")
            )
            overhead.begin("authentication")  # ends as the route's response runs
            state[OVERHEAD_STATE] = overhead
            record: AccessRecord | None = state.get(access_log.STATE)
            if request_trace is not None and record is not None:
                record.trace_id = request_trace.trace_id
        if request_trace is None:
            await self._serve(scope, receive, send, path, gateway, None)
            return
        # Current for the request's lifetime: whatever it runs, logs or calls upstream
        # happens in its trace.
        token = request_trace.attach()
        try:
            await self._serve(scope, receive, send, path, gateway, request_trace)
        except Exception as exc:
            request_trace.failed(exc)
            raise
        finally:
            request_trace.close()
            request_trace.detach(token)

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        path: str,
        gateway: Gateway | None,
        request_trace: tracing.RequestTrace | None,
    ) -> None:
        headers = Headers(scope=scope)
        refusal = await self._check_credentials(scope, path, headers, gateway)
        limit = self._body_limit(scope, path, headers)
        if refusal is None and _content_length(headers) > limit.bytes:
            refusal = limit.refusal()
            if is_admin_path(path):
                await record_admin_failure(gateway, scope, path, "rejected", refusal.message)
        if refusal is not None:
            if request_trace is not None:
                request_trace.failed(refusal)
            await _refuse(refusal, scope, send)
            return
        if _declared_length_only(headers):
            # The server reads exactly the declared length, already checked: the body cannot
            # pass the limit, so the app runs without the counting wrappers (every streamed
            # event would pass through one).
            await self.app(scope, receive, send)
            return
        if await self._within_limit(scope, receive, send, limit) and is_admin_path(path):
            await record_admin_failure(gateway, scope, path, "rejected", limit.refusal().message)

    async def _check_credentials(
        self, scope: Scope, path: str, headers: Headers, gateway: Gateway | None
    ) -> GatewayError | None:
        token = parse_bearer(headers.get("authorization", ""))
        if path == "/metrics":
            if self._metrics_listener and not self._metrics_tokens:
                return None
            accepted = [*self._metrics_tokens, *(gateway.admin_tokens if gateway else [])]
            return None if matches_any(token, accepted) else _invalid_metrics_token()
        if gateway is None or self._metrics_listener:
            return None
        if path.startswith("/v1/"):
            try:
                principal = gateway.authenticate(token)
                record: AccessRecord | None = scope.get("state", {}).get(access_log.STATE)
                if record is not None:
                    record.tenant, record.key_id = principal.tenant.id, principal.key_id
                endpoint = GENERATION_ENDPOINTS.get(path) if scope["method"] == "POST" else None
                if endpoint is not None:
                    await gateway.tracker.precheck(principal, endpoint)
                    scope.setdefault("state", {})[PRECHECKED] = principal
            except GatewayError as exc:
                return exc
        elif is_admin_path(path) and not matches_any(token, gateway.admin_tokens):
            await record_auth_failure(gateway, self._throttle, scope, path, token)
            return AuthenticationError(INVALID_ADMIN_TOKEN)
        return None

    def _body_limit(self, scope: Scope, path: str, headers: Headers) -> BodyLimit:
        multipart = scope["method"] == "POST" and headers.get("content-type", "").startswith(
            "multipart/form-data"
        )
        if multipart and path in ADAPTER_UPLOAD_PATHS:
            return self._upload_limit
        if multipart and path == FILE_UPLOAD_PATH:
            return self._file_limit
        return self._request_limit

    async def _within_limit(
        self, scope: Scope, receive: Receive, send: Send, limit: BodyLimit
    ) -> bool:
        """Run the app, cutting the body off once it passes ``limit`` bytes: from
        then on, whatever the app answers to the cut-off body becomes the 413
        (and its error handlers see ``BODY_CUT_OFF`` in the request's state).
        Whether it was cut off."""
        too_large = limit.refusal()
        received = 0
        exceeded = responded = False

        async def counting_receive() -> Message:
            nonlocal received, exceeded
            if exceeded:
                raise too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit.bytes:
                    exceeded = True
                    scope.setdefault("state", {})[BODY_CUT_OFF] = True
                    raise too_large
            return message

        async def replacing_send(message: Message) -> None:
            nonlocal responded
            if exceeded:
                if not responded:
                    responded = True
                    await _refuse(too_large, scope, send)
                return
            if message["type"] == "http.response.start":
                responded = True
            await send(message)

        try:
            await self.app(scope, counting_receive, replacing_send)
        except Exception:
            # The app gave up on the body we cut off (FastAPI answers most such
            # failures itself, and replacing_send has turned that into the 413).
            if not exceeded:
                raise
            if not responded:
                responded = True
                await _refuse(too_large, scope, send)
        return exceeded


def _invalid_metrics_token() -> AuthenticationError:
    return AuthenticationError(
        "GET /metrics needs `Authorization: Bearer <metrics token>` (or an admin token)."
    )


def _declared_length_only(headers: Headers) -> bool:
    """Whether the body is exactly one declared ``Content-Length`` long (no chunked body)."""
    lengths = headers.getlist("content-length")
    return len(lengths) == 1 and lengths[0].isdigit() and "transfer-encoding" not in headers


def _content_length(headers: Headers) -> int:
    value = headers.get("content-length", "")
    return int(value) if value.isdigit() else 0


async def _refuse(error: GatewayError, scope: Scope, send: Send) -> None:
    response = render(error)
    # The server would otherwise read (and discard) the rest of the body to
    # keep the connection: close it instead.
    response.headers["connection"] = "close"
    await response(scope, _nothing_to_receive, send)


async def _nothing_to_receive() -> Message:
    raise RuntimeError("a refused request's body is never read")
