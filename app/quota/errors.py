"""Quota errors, in the gateway's OpenAI-shaped hierarchy.

GatewayError
├── QuotaExceeded             429 rate_limit_exceeded | insufficient_quota
├── QuotaBackendUnavailable   503 quota_backend_unavailable
└── BadRequestError
    └── QuotaTooLarge         400 request_too_large
"""

from __future__ import annotations

from app.errors import BadRequestError, GatewayError
from app.quota.limits import LimitKind


class QuotaExceeded(GatewayError):
    """A limit refused the request (429); nothing was consumed.

    Rate and concurrency limits answer ``rate_limit_exceeded`` (type ``requests`` or ``tokens``)
    with ``Retry-After``; a spent token budget answers ``insufficient_quota`` with
    ``x-should-retry: false``, as OpenAI does, since retrying cannot help before the next period.
    """

    status_code = 429

    def __init__(
        self,
        message: str,
        *,
        limit: LimitKind,
        subject: str,
        retry_after: float | None,
        headers: dict[str, str],
    ) -> None:
        super().__init__(message, headers=headers)
        self.limit: LimitKind = limit
        self.subject = subject
        self.retry_after = retry_after
        if limit == "budget":
            self.code = "insufficient_quota"
            self.error_type = "insufficient_quota"
        else:
            self.code = "rate_limit_exceeded"
            self.error_type = "tokens" if limit == "tokens" else "requests"


class QuotaTooLarge(BadRequestError):
    """The request alone exceeds a limit (tokens per minute, or the whole budget), so it could
    never be admitted: a 400 rather than a 429 the client would retry forever."""

    code = "request_too_large"

    def __init__(self, message: str, *, limit: LimitKind, subject: str) -> None:
        super().__init__(message)
        self.limit: LimitKind = limit
        self.subject = subject


class QuotaBackendUnavailable(GatewayError):
    """The quota store failed (unreachable, timed out, read-only after a failover, out of
    memory, an unexpected reply) and the backend fails closed (503).

    ``reason`` names the failure for metrics and logs; the client's message does not."""

    status_code = 503
    code = "quota_backend_unavailable"

    def __init__(
        self,
        message: str = "Rate limiting is temporarily unavailable. Please retry shortly.",
        *,
        reason: str = "unreachable",
    ) -> None:
        super().__init__(message)
        self.reason = reason
