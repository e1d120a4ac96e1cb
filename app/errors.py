"""The gateway's error hierarchy; each error knows its OpenAI-shaped rendering.

GatewayError                      500 server_error
├── GenerationFailedError             generation_failed (the engine ended a request with an error)
├── AdapterUnservableError            adapter_unservable (its adapter version fails to load)
├── AuthenticationError           401 invalid_api_key
├── PermissionDeniedError         403 (tenant disabled)
├── ModelNotFoundError            404 model_not_found
├── StorageLimitError             429 storage_limit_exceeded (files and stored responses)
├── BatchTokensLimitError         429 batch_tokens_enqueued_exceeded (a new batch)
├── BadRequestError               400 invalid_request_error
│   ├── ContextLengthExceededError    context_length_exceeded
│   └── RequestTooLargeError      413 request_too_large (the body, refused unread)
├── UpstreamRefusedError          4xx as the upstream said (front role: its refusal, passed on)
├── UpstreamError                 502 upstream_error (front role: the upstream failed)
│   └── UpstreamTimeoutError      504 upstream_timeout
└── EngineUnavailableError        503 engine_unavailable
    └── UpstreamUnavailableError      upstream_unavailable (front role: nothing answers)
"""

from __future__ import annotations

from typing import Any


class GatewayError(Exception):
    status_code = 500
    error_type = "server_error"
    code: str | None = None

    def __init__(
        self, message: str, *, param: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


class AuthenticationError(GatewayError):
    status_code = 401
    error_type = "invalid_request_error"
    code = "invalid_api_key"


class PermissionDeniedError(GatewayError):
    status_code = 403
    error_type = "invalid_request_error"
    code = "permission_denied"


class ModelNotFoundError(GatewayError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "model_not_found"

    def __init__(self, model: str) -> None:
        super().__init__(
            f"The model `{model}` does not exist or you do not have access to it.",
            param="model",
        )


class StorageLimitError(GatewayError):
    """The tenant's files and stored responses would pass its ``storage_bytes`` cap."""

    status_code = 429
    error_type = "insufficient_quota"
    code = "storage_limit_exceeded"

    def __init__(self, cap: int) -> None:
        super().__init__(
            f"This would pass your storage limit, `storage_bytes` ({cap} bytes, files and "
            "stored responses together): delete files or stored responses first.",
            param="storage_bytes",
            headers={"x-should-retry": "false"},
        )
        self.cap = cap


class FileStorageLimitError(StorageLimitError):
    """An upload that does not fit in the tenant's ``storage_bytes``: a 413, as a file past
    its size limit is (until the tenant deletes files or stored responses, it cannot fit)."""

    status_code = 413
    error_type = "invalid_request_error"


class BatchTokensLimitError(GatewayError):
    """The tenant's batches' unrun lines are at its ``batch_tokens_enqueued`` quota."""

    status_code = 429
    error_type = "insufficient_quota"
    code = "batch_tokens_enqueued_exceeded"

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"Your batches' unrun lines are at your limit, `batch_tokens_enqueued` ({limit} "
            "worst-case tokens): create this batch once some have run.",
            param="batch_tokens_enqueued",
        )


class BadRequestError(GatewayError):
    status_code = 400
    error_type = "invalid_request_error"


class ContextLengthExceededError(BadRequestError):
    code = "context_length_exceeded"


class RequestTooLargeError(BadRequestError):
    status_code = 413
    code = "request_too_large"

    def __init__(
        self,
        limit: int,
        *,
        what: str = "The request body",
        param: str | None = None,
        setting: str = "max_request_bytes",
    ) -> None:
        super().__init__(
            f"{what} is larger than the limit of {limit} bytes (the gateway's `{setting}`).",
            param=param,
        )


class GenerationFailedError(GatewayError):
    code = "generation_failed"


class AdapterUnservableError(GatewayError):
    """The adapter version a model names failed to load in the engine (and is refused until
    replaced); ``reason`` is the engine's, for the audit log, never the tenant's answer."""

    code = "adapter_unservable"

    def __init__(self, model: str, reason: str) -> None:
        super().__init__(
            f"The model `{model}` cannot be served: its adapter failed to load in the engine. "
            "The administrator has been told; other models are unaffected."
        )
        self.reason = reason


class EngineUnavailableError(GatewayError):
    status_code = 503
    code = "engine_unavailable"


class UpstreamUnavailableError(EngineUnavailableError):
    code = "upstream_unavailable"


class StoreUnavailableError(EngineUnavailableError):
    code = "store_unavailable"


class UpstreamError(GatewayError):
    status_code = 502
    code = "upstream_error"


class UpstreamTimeoutError(UpstreamError):
    status_code = 504
    code = "upstream_timeout"


class UpstreamRefusedError(GatewayError):
    """A 4xx the upstream answered, passed on with its status, type, code and field."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        error_type: str,
        code: str | None,
        param: str | None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, param=param, headers=headers)
        self.status_code = status_code
        self.error_type = error_type
        self.code = code


class NotFoundError(GatewayError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "not_found"


class ConflictError(GatewayError):
    status_code = 409
    error_type = "invalid_request_error"
    code = "conflict"
