"""A Response made of what the chat path answered: its output items, status and usage.

Two forms, one shape: :func:`response` (a :class:`ResponseObject`, for a non-streamed answer
and a background response's row) and :func:`response_body` (the same as JSON-ready data,
written directly: a stream makes two Responses per request, and validating each into a model
only to dump it again cost a streamed response most of what it spent beyond chat's).
"""

from __future__ import annotations

import json
import time
from json.encoder import encode_basestring_ascii
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
from app.serving.preparation.responses import Translated, new_id

Body = dict[str, Any]
"""A Response, or a part of one, as JSON-ready data (what ``model_dump(mode="json")`` gives)."""


def usage(prompt_tokens: int, completion_tokens: int) -> ResponseUsage:
    return ResponseUsage(
        input_tokens=prompt_tokens,
        output_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


def usage_body(prompt_tokens: int, completion_tokens: int) -> Body:
    """:func:`usage`, as its ``model_dump()``."""
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _state(status: str, finish_reason: str | None) -> tuple[str, int | None, Body | None]:
    """A Response's status, ``completed_at`` and ``incomplete_details`` when it ends (or
    stands) in ``status`` after ``finish_reason``: a ``length`` finish makes a completed one
    ``incomplete`` (its output cut at ``max_output_tokens``)."""
    if status == "completed" and finish_reason == "length":
        return "incomplete", None, {"reason": "max_output_tokens"}
    final = status in ("completed", "failed")
    return status, int(time.time()) if final else None, None


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
    status, completed_at, incomplete = _state(status, finish_reason)
    return ResponseObject(
        id=translated.response_id,
        created_at=translated.created_at,
        completed_at=completed_at,
        status=status,
        error=error,
        incomplete_details=None if incomplete is None else IncompleteDetails(**incomplete),
        model=translated.request.model,
        output=output,
        usage=token_usage,
        **translated.echoed,
    )


def response_body(
    translated: Translated,
    output: list[Body],
    *,
    status: str,
    finish_reason: str | None = None,
    token_usage: Body | None = None,
    error: Body | None = None,
) -> Body:
    """:func:`response` with its parts as JSON-ready data, as ``model_dump(mode="json")``
    writes it (its fields in the model's order), without the model."""
    status, completed_at, incomplete = _state(status, finish_reason)
    echoed = translated.echoed
    return {
        "id": translated.response_id,
        "object": "response",
        "created_at": translated.created_at,
        "completed_at": completed_at,
        "status": status,
        "error": error,
        "incomplete_details": incomplete,
        "model": translated.request.model,
        "instructions": echoed["instructions"],
        "output": output,
        **echoed,  # the model's order: the instructions stay where they are
        "usage": token_usage,
    }


_INCOMPLETE_JSON = '{"reason": "max_output_tokens"}'


def usage_json(prompt_tokens: int, completion_tokens: int) -> str:
    """:func:`usage_body`, as ``json.dumps`` writes it."""
    return (
        f'{{"input_tokens": {prompt_tokens}, "input_tokens_details": {{"cached_tokens": 0, '
        f'"cache_write_tokens": 0}}, "output_tokens": {completion_tokens}, '
        f'"output_tokens_details": {{"reasoning_tokens": 0}}, '
        f'"total_tokens": {prompt_tokens + completion_tokens}}}'
    )


def json_value(value: Any) -> str:
    """``value`` as ``json.dumps`` writes it: a string, an integer or null (most) directly,
    without the encoder ``json.dumps`` makes for each."""
    kind = type(value)
    if kind is str:
        return encode_basestring_ascii(value)
    if kind is int:
        return int.__repr__(value)
    return "null" if value is None else json.dumps(value)


class ResponseText:
    """The Responses of one request as JSON text, as ``json.dumps`` writes
    :func:`response_body`'s: what they all repeat of the request (its echoed fields, most of
    a Response) encoded once, each Response then written around its state, output and
    usage (a stream writes two or three)."""

    def __init__(self, translated: Translated) -> None:
        echoed = translated.echoed
        self._head = (
            f'{{"id": {json_value(translated.response_id)}, "object": "response", '
            f'"created_at": {json_value(translated.created_at)}, "completed_at": '
        )
        self._model = (
            f', "model": {json_value(translated.request.model)}, '
            f'"instructions": {json_value(echoed["instructions"])}, "output": ['
        )
        rest = {name: value for name, value in echoed.items() if name != "instructions"}
        self._tail = f"], {json.dumps(rest)[1:-1]}, " + '"usage": '

    def write(
        self,
        output: list[str],
        *,
        status: str,
        finish_reason: str | None = None,
        token_usage: str | None = None,
    ) -> str:
        """:func:`response_body` (with no error) as JSON text, of the ``output`` items' and
        the ``token_usage``'s JSON texts."""
        status, completed_at, incomplete = _state(status, finish_reason)
        return (
            f"{self._head}{'null' if completed_at is None else completed_at}, "
            f'"status": "{status}", "error": null, "incomplete_details": '
            f"{'null' if incomplete is None else _INCOMPLETE_JSON}{self._model}"
            f"{', '.join(output)}{self._tail}{token_usage or 'null'}}}"
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
