"""Audit records for the admin requests the admin service never sees.

The service audits every mutation it runs, accepted or rejected. What fails
before or around it is recorded here: a refused admin token (action
``admin.auth``, outcome ``denied``), a request refused by validation (400,
outcome ``rejected``) and a server error (500, outcome ``error``). Records
never hold a token (a valid one appears as its hash prefix) nor request data;
refused tokens are throttled per source address, so an attacker cannot
flood the audit table. The console's refused sign-ins share the throttle: one
:class:`AuthFailureThrottle` per app (``app.state.auth_failure_throttle``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from starlette.datastructures import Headers
from starlette.types import Scope

from app import metrics
from app.api.admin.deps import actor_name
from app.api.deps import matches_any, parse_bearer

if TYPE_CHECKING:
    from app.gateway import Gateway

logger = logging.getLogger(__name__)

ADMIN_PREFIX = "/admin/v1"
UNAUTHENTICATED = "unauthenticated"
TARGET_CHARS = 255  # the audit table's target column


def is_admin_path(path: str) -> bool:
    return path == ADMIN_PREFIX or path.startswith(ADMIN_PREFIX + "/")


def _target(scope: Scope, path: str) -> str:
    # The path only: a query string is the caller's, and may hold anything.
    return f"{scope.get('method', '')} {path}"[:TARGET_CHARS]


def _source(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


class AuthFailureThrottle:
    """Decides which refused admin tokens get an audit record: in each window
    of ``window_seconds``, the first from each source address, and at most
    ``per_window`` in all (an attacker cycling addresses is capped too).
    Memory is bounded by ``per_window``. One per app, whichever door the token
    was refused at (the admin API or the console's sign-in)."""

    def __init__(
        self,
        *,
        window_seconds: float = 60.0,
        per_window: int = 60,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._window = window_seconds
        self._per_window = per_window
        self._clock = clock
        self._started = clock()
        self._recorded: set[str] = set()

    def allow(self, source: str) -> bool:
        now = self._clock()
        if now - self._started >= self._window:
            self._started, self._recorded = now, set()
        if source in self._recorded or len(self._recorded) >= self._per_window:
            return False
        self._recorded.add(source)
        return True


def audit_refused_token(throttle: AuthFailureThrottle, source: str) -> bool:
    """Whether a token refused from ``source`` gets an audit record (the throttle decides);
    counted in ``lora_gateway_admin_auth_failures_total`` either way."""
    audited = throttle.allow(source)
    metrics.ADMIN_AUTH_FAILURES.labels("yes" if audited else "no").inc()
    return audited


async def _write(
    gateway: Gateway, actor: str, action: str, target: str, outcome: str, detail: str
) -> None:
    # The audit record must never change the answer: a store that fails here
    # (often the very cause of a 500) is logged, and the response leaves as it was.
    try:
        await gateway.admin.audit(actor, action, target, outcome, detail)
    except Exception:
        logger.exception("could not write the audit record of %s %s", action, target)


async def record_auth_failure(
    gateway: Gateway, throttle: AuthFailureThrottle, scope: Scope, path: str, token: str | None
) -> None:
    """Audit (throttled) and count an admin request refused for its token."""
    source = _source(scope)
    if audit_refused_token(throttle, source):
        reason = "no admin token" if token is None else "invalid admin token"
        await _write(
            gateway,
            UNAUTHENTICATED,
            "admin.auth",
            _target(scope, path),
            "denied",
            f"{reason} from {source}",
        )


async def record_admin_failure(
    gateway: Gateway | None, scope: Scope, path: str, outcome: str, detail: str
) -> None:
    """Audit an admin request that failed outside the admin service (validation
    or a server error), under the caller's admin name when its token is valid."""
    if gateway is None:
        return
    token = parse_bearer(Headers(scope=scope).get("authorization", ""))
    valid = token is not None and matches_any(token, gateway.admin_tokens)
    actor = actor_name(token) if valid and token is not None else UNAUTHENTICATED
    await _write(gateway, actor, "admin.request", _target(scope, path), outcome, detail)
