"""OpenAI wire models: what clients send (:mod:`.requests`, with :mod:`.tools` and the
shared :mod:`.common`) and what they get back (:mod:`.responses`)."""

from app.protocol.common import INT64_MAX, INT64_MIN
from app.protocol.requests import (
    UNSUPPORTED_FIELDS,
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
)
from app.protocol.responses import (
    ERROR_RESPONSES,
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    ErrorResponse,
    ModelCard,
    ModelList,
    TokenLogprob,
    TopLogprob,
    Usage,
)

__all__ = [
    "ERROR_RESPONSES",
    "INT64_MAX",
    "INT64_MIN",
    "UNSUPPORTED_FIELDS",
    "AssistantMessage",
    "ChatChoice",
    "ChatChunkChoice",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatDelta",
    "ChatLogprobs",
    "Completion",
    "CompletionChoice",
    "CompletionLogprobs",
    "CompletionRequest",
    "ErrorResponse",
    "ModelCard",
    "ModelList",
    "SamplingFields",
    "TokenLogprob",
    "TopLogprob",
    "Usage",
]
