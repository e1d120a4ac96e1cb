"""The front role's one connection to its upstream: vLLM's OpenAI server, or in Kubernetes the
inference gateway in front of the engine pool.

One :class:`~app.serving.front.http1.Http1Client` per process, opened and closed by
:func:`open_upstream` (the app's lifespan enters it). This module also turns what the upstream
answers into the gateway's errors (:func:`refusal`, :func:`transport_error`), so nothing above
it handles a transport's exception or reads an upstream error body.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from app.errors import (
    GatewayError,
    UpstreamError,
    UpstreamRefusedError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from app.serving.front.http1 import ConnectFailed, Http1Client, ReadTimedOut, TransportError
from app.settings import Settings
from app.tenancy.tenants import Tenant

logger = logging.getLogger(__name__)

CONNECT_SECONDS = 5.0
"""Longest wait for a connection to the upstream: a pool that accepts none is down, and the
client should hear so (503) long before a generation's timeout."""

FAIRNESS_HEADER = "x-llm-d-inference-fairness-id"
OBJECTIVE_HEADER = "x-llm-d-inference-objective"
SHADOW_OBJECTIVE = "shadow"
"""The objective of shadow requests: sheddable (deploy/kubernetes/inference-objectives.yaml)."""

# The upstream answering these means the front itself is misconfigured (its credentials, a
# proxy): not the client's fault, so not passed on as the client's error.
_FRONT_FAULTS = frozenset({401, 403, 407})


class Upstream:
    """Where requests are forwarded, through one shared set of connections, and the fewest
    tokens each streamed chunk is asked to gather (the deployment's ``stream_interval``)."""

    def __init__(self, client: Http1Client, stream_interval: int = 1) -> None:
        self.client = client
        self.stream_interval = stream_interval


@asynccontextmanager
async def open_upstream(settings: Settings) -> AsyncIterator[Upstream]:
    """The upstream of ``settings`` (``upstream_url``), its connections closed on exit."""
    if not settings.upstream_url:
        raise ValueError("the front role needs upstream_url")
    # No connection limit of our own: quotas bound the requests a tenant has in flight, and
    # a limit here would queue requests the upstream's scheduler should see.
    client = Http1Client(
        settings.upstream_url,
        timeout=settings.upstream_timeout_seconds,
        connect_timeout=min(CONNECT_SECONDS, settings.upstream_timeout_seconds),
        max_idle=settings.upstream_idle_connections,
    )
    try:
        yield Upstream(client, settings.stream_interval)
    finally:
        await client.aclose()


def request_headers(tenant: Tenant, request_id: str, *, shadow: bool = False) -> dict[str, str]:
    """The headers a forwarded request carries: these and nothing a client sent.

    No client header is ever forwarded, so a client cannot set the llm-d router's headers
    (``x-llm-d-*``: the model rewrite, another tenant's fairness id, an objective) nor the
    gateway's own (``x-gateway-*``). A shadow goes under the sheddable objective, which the
    pool drops first when saturated."""
    headers = {"x-request-id": request_id, FAIRNESS_HEADER: tenant.id}
    objective = SHADOW_OBJECTIVE if shadow else objective_of(tenant)
    if objective is not None:
        headers[OBJECTIVE_HEADER] = objective
    return headers


def objective_of(tenant: Tenant) -> str | None:
    """The llm-d InferenceObjective a tenant's requests are scheduled under: its priority
    class (``interactive``, ``batch``), the name the deployment gives its objectives."""
    return tenant.priority


def transport_error(exc: TransportError) -> GatewayError:
    """The gateway's error for a request that got no usable answer from the upstream."""
    if isinstance(exc, ConnectFailed):
        return UpstreamUnavailableError("The upstream is unreachable; retry shortly.")
    if isinstance(exc, ReadTimedOut):
        return UpstreamTimeoutError("The upstream did not answer in time.")
    return UpstreamError("The upstream failed while answering.")


def refusal(
    status: int, body: bytes, names: Mapping[str, str], retry_after: str | None = None
) -> GatewayError:
    """The gateway's error for an upstream's error answer of ``status``.

    A 4xx is the client's request refused: passed on, with its message, field and code, each
    of ``names``' keys (the global names this request was sent with) written as its value
    (the name the tenant used), so no global name reaches the tenant. A 5xx is the upstream's
    own failure: its text stays in the log. The upstream's ``Retry-After`` (a pool shedding
    load: 429, 503) is passed on."""
    error = _refusal(status, body, names)
    if retry_after is not None and status in (429, 503):
        error.headers["Retry-After"] = retry_after
    return error


def _refusal(status: int, body: bytes, names: Mapping[str, str]) -> GatewayError:
    if status == 408:
        return UpstreamTimeoutError("The upstream did not answer in time.")
    if status in _FRONT_FAULTS or status < 400:
        logger.error("the upstream answered %s: %s", status, body[:500])
        return UpstreamError(f"The upstream refused the gateway (HTTP {status}).")
    if status >= 500:
        logger.warning("the upstream failed with %s: %s", status, body[:500])
        if status == 503:
            return UpstreamUnavailableError("No engine can take the request now; retry shortly.")
        if status == 504:
            return UpstreamTimeoutError("The upstream did not answer in time.")
        return UpstreamError(f"The upstream failed (HTTP {status}).")
    detail = _error_detail(body)
    said = detail.get("message") or f"Refused by the upstream (HTTP {status})."
    message = _renamed(str(said), names)
    param = detail.get("param")
    code = detail.get("code")
    return UpstreamRefusedError(
        message,
        status_code=status,
        error_type=_openai_type(status, detail.get("type")),
        code=_renamed(code, names) if isinstance(code, str) and not code.isdigit() else None,
        param=_renamed(str(param), names) if param is not None else None,
    )


def _openai_type(status: int, upstream_type: object) -> str:
    """An OpenAI error type: vLLM's server names its exception classes (``BadRequestError``,
    ``RateLimitError``) and puts the status in ``code``, which OpenAI clients do not know."""
    if isinstance(upstream_type, str) and re.fullmatch(r"[a-z]+(_[a-z]+)*", upstream_type):
        return upstream_type
    return "requests" if status == 429 else "invalid_request_error"


def _error_detail(body: bytes) -> dict[str, Any]:
    """The ``error`` object of an OpenAI-shaped error body (vLLM's older servers put its
    fields at the top level); empty when the body is neither."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return {}
    if not isinstance(parsed, dict):
        return {}
    detail = parsed.get("error", parsed)
    return detail if isinstance(detail, dict) else {}


def _renamed(text: str, names: Mapping[str, str]) -> str:
    for global_name, alias in names.items():
        text = text.replace(global_name, alias)
    return text
