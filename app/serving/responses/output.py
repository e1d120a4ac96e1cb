"""A Response made of what the chat path answered: its output items, status and usage."""

from __future__ import annotations

import time
from typing import Any

from app.protocol import ChatCompletion
from app.protocol.responses_api import (
    FunctionCallOutput,
    IncompleteDetails,
    OutputItem,
    OutputMessage,
    OutputText,
    ResponseError,
    ResponseObject,
    ResponseUsage,
)
from app.serving.preparation.responses import Translated, echoed_fields, new_id


def usage(prompt_tokens: int, completion_tokens: int) -> ResponseUsage:
    return ResponseUsage(
        input_tokens=prompt_tokens,
        output_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


def response(
    translated: Translated,
    output: list[OutputItem],
    *,
    status: str,
    finish_reason: str | None = None,
    token_usage: ResponseUsage | None = None,
    error: ResponseError | None = None,
) -> ResponseObject:
    """The Response for ``translated`` in ``status``; a ``length`` finish makes it
    ``incomplete`` (its output cut at ``max_output_tokens``)."""
    incomplete = status == "completed" and finish_reason == "length"
    final = status in ("completed", "failed")
    return ResponseObject(
        id=translated.response_id,
        created_at=translated.created_at,
        completed_at=int(time.time()) if final and not incomplete else None,
        status="incomplete" if incomplete else status,
        error=error,
        incomplete_details=IncompleteDetails(reason="max_output_tokens") if incomplete else None,
        model=translated.request.model,
        output=output,
        usage=token_usage,
        **echoed_fields(translated.request),
    )


def output_items(
    content: str | None, calls: list[tuple[str, str, str]], status: str
) -> list[OutputItem]:
    """A message with ``content`` (where there is some, or nothing else), then a
    ``function_call`` per call (its call id, name and arguments)."""
    items: list[OutputItem] = []
    if content or not calls:
        text = OutputText(text=content or "")
        items.append(OutputMessage(id=new_id("msg"), status=status, content=[text]))
    for call_id, name, arguments in calls:
        items.append(
            FunctionCallOutput(id=new_id("fc"), call_id=call_id, name=name, arguments=arguments)
        )
    return items


def from_chat(translated: Translated, completion: ChatCompletion) -> ResponseObject:
    """The Response of a finished chat completion (its one choice)."""
    choice = completion.choices[0]
    message = choice.message
    calls = [
        (call.id, call.function.name, call.function.arguments) for call in message.tool_calls or []
    ]
    incomplete = choice.finish_reason == "length"
    return response(
        translated,
        output_items(message.content, calls, "incomplete" if incomplete else "completed"),
        status="completed",
        finish_reason=choice.finish_reason,
        token_usage=usage(completion.usage.prompt_tokens, completion.usage.completion_tokens),
    )


def error_of(body: dict[str, Any]) -> ResponseError:
    """A Response's ``error`` for an OpenAI error body (``{"error": {...}}``): OpenAI's codes
    for a Response say whose the failure was, not which check failed."""
    detail = body.get("error") or {}
    code = detail.get("code")
    if code == "rate_limit_exceeded":
        kind = "rate_limit_exceeded"
    elif detail.get("type") == "invalid_request_error":
        kind = "invalid_prompt"
    else:
        kind = "server_error"
    return ResponseError(code=kind, message=str(detail.get("message", "the response failed")))
