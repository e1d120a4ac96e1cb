"""The names in a request's trace: its spans' and their attributes' (the GenAI semantic
conventions', and the gateway's own under ``lora_gateway.``): docs/operations.md, "Traces"."""

from __future__ import annotations

from typing import Final

PREFIX: Final = "lora_gateway."
OPERATION: Final = "gen_ai.operation.name"
REQUEST_MODEL: Final = "gen_ai.request.model"
RESPONSE_MODEL: Final = "gen_ai.response.model"
MAX_TOKENS: Final = "gen_ai.request.max_tokens"
INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
ERROR_TYPE: Final = "error.type"
STATUS_CODE: Final = "http.response.status_code"
REQUEST_ID: Final = PREFIX + "request_id"
TENANT: Final = PREFIX + "tenant.id"
KEY: Final = PREFIX + "key.id"
ADAPTER: Final = PREFIX + "adapter.name"
ADAPTER_VERSION: Final = PREFIX + "adapter.version"
PRIORITY: Final = PREFIX + "priority"
QUEUE_WAIT_MS: Final = PREFIX + "queue_wait_ms"
STREAM: Final = PREFIX + "stream"
OUTCOME: Final = PREFIX + "outcome"

QUOTA: Final = "quota.reserve"
ADMISSION: Final = "admission"
ENGINE: Final = "engine"
FIRST_TOKEN: Final = "engine.first_token"
REST: Final = "engine.rest"
SETTLEMENT: Final = "settlement"

OPERATIONS: Final = {
    "chat.completions": "chat",
    "completions": "text_completion",
    "responses": "chat",
}
"""The GenAI operation name of each endpoint."""
