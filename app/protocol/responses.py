"""What clients get back: completions, chunks, usage, logprobs, model cards, errors."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = Field(description="the request field at fault, where one is")
    code: str | None


class ErrorResponse(BaseModel):
    """Every refusal and failure, on every route (app/errors.py renders it)."""

    error: ErrorDetail


# Every route's errors, for /openapi.json. A 4XX entry also keeps FastAPI from advertising
# its own 422 body, which no route returns (a validation error is a 400 in the shape above).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ErrorResponse, "description": "Refused (OpenAI error shape)"},
    "5XX": {"model": ErrorResponse, "description": "Server error or engine unavailable"},
}


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


FinishReason = Literal["stop", "length", "tool_calls"] | None


class FunctionCall(BaseModel):
    name: str
    # A JSON text, as OpenAI sends it: clients parse it themselves.
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason


def _now() -> int:
    return int(time.time())


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChoice]
    usage: Usage


class FunctionCallDelta(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(BaseModel):
    """A piece of ``tool_calls[index]``: the first one carries its id and name."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str
    parent: str | None = None
    root: str | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
