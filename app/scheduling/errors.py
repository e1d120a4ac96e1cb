"""Admission errors, in the gateway's OpenAI-shaped hierarchy.

GatewayError
└── AdmissionRefused    429 rate_limit_exceeded (queue full, or waited too long), Retry-After
"""

from __future__ import annotations

from typing import Literal

from app.errors import GatewayError
from app.quota.headers import retry_headers

RefusalReason = Literal["queue_full", "queue_timeout"]


class AdmissionRefused(GatewayError):
    """The tenant's queue for the engine is full, or the request waited in it longer than
    the limit; nothing ran. ``Retry-After`` estimates when the queue will have moved."""

    status_code = 429
    error_type = "requests"
    code = "rate_limit_exceeded"

    def __init__(self, reason: RefusalReason, retry_after: float) -> None:
        headers = retry_headers(max(1.0, retry_after))
        message = (
            "Too many of your requests are waiting for the engine"
            if reason == "queue_full"
            else "Your request waited too long for the engine"
        )
        super().__init__(f"{message}; retry in {headers['retry-after']} s.", headers=headers)
        self.reason: RefusalReason = reason
        self.retry_after = float(headers["retry-after"])
