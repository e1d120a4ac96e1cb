"""The one translation of a Responses request into the chat request the chat path runs
(:func:`translate`), in both roles: the front forwards the chat request upstream, in-process
the engine runs it, and admission, quotas, the ledger, rollouts and metrics are the chat
path's own. Items are kept in the shapes ``GET /v1/responses/{id}/input_items`` lists them
(:func:`stored_items`), and a chain's earlier items come back as chat messages."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from pydantic import ValidationError

from app.errors import BadRequestError, GatewayError
from app.ids import random_hex
from app.protocol import ChatCompletionRequest
from app.protocol.responses_api import (
    FunctionCallInput,
    FunctionCallOutputInput,
    InputMessage,
    ResponsesRequest,
)

Item = dict[str, Any]
"""An input or output item as stored and listed (OpenAI's ``ResponseItem`` shapes)."""


def new_id(prefix: str) -> str:
    """A new id: ``prefix``, then 32 random hex digits."""
    return f"{prefix}_{random_hex()}"


@dataclass(frozen=True)
class Translated:
    """A Responses request, translated: the chat request that runs it, and what its Response
    and its stored row are made of."""

    response_id: str
    created_at: int
    request: ResponsesRequest
    chat: ChatCompletionRequest
    input_items: list[Item]
    """This request's input, as stored."""
    context: list[Item]
    """The chain's items before this request's input (the previous responses' inputs and
    outputs), as stored."""

    @cached_property
    def echoed(self) -> Mapping[str, Any]:
        """:func:`echoed_fields` of the request: made once for each of its Responses (a stream
        makes two)."""
        return echoed_fields(self.request)


def stored_items(request: ResponsesRequest) -> list[Item]:
    """The request's ``input`` as stored items, each with an id."""
    if isinstance(request.input, str):
        return [_message_item("user", request.input)]
    stored: list[Item] = []
    for item in request.input:
        if isinstance(item, InputMessage):
            stored.append(_message_item(item.role, item.text()))
        elif isinstance(item, FunctionCallInput):
            stored.append(
                {
                    "id": item.id or new_id("fc"),
                    "type": "function_call",
                    "call_id": item.call_id,
                    "name": item.name,
                    "arguments": item.arguments,
                    "status": "completed",
                }
            )
        elif isinstance(item, FunctionCallOutputInput):
            stored.append(
                {
                    "id": item.id or new_id("fco"),
                    "type": "function_call_output",
                    "call_id": item.call_id,
                    "output": item.text(),
                    "status": "completed",
                }
            )
    return stored


def _message_item(role: str, text: str) -> Item:
    if role == "assistant":
        part = {"type": "output_text", "text": text, "annotations": []}
    else:
        part = {"type": "input_text", "text": text}
    return {
        "id": new_id("msg"),
        "type": "message",
        "role": role,
        "content": [part],
        "status": "completed",
    }


def chat_messages(instructions: str | None, items: Iterable[Item]) -> list[dict[str, Any]]:
    """The chat messages ``items`` stand for, after a system message with ``instructions``:
    consecutive function calls are one assistant message's ``tool_calls``, a call's output a
    ``tool`` message."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for item in items:
        kind = item["type"]
        if kind == "message":
            text = "".join(part.get("text", "") for part in item["content"])
            messages.append({"role": item["role"], "content": text})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
            )
    return messages


def _tool_choice(request: ResponsesRequest) -> Any:
    choice = request.tool_choice
    if choice is None or isinstance(choice, str):
        return choice
    return {"type": "function", "function": {"name": choice.name}}


def _tools(request: ResponsesRequest) -> list[dict[str, Any]] | None:
    if request.tools is None:
        return None
    return [
        {
            "type": "function",
            "function": tool.model_dump(exclude={"type"}, exclude_none=True),
        }
        for tool in request.tools
    ]


# Chat's field names, as a Responses client knows them (the first match is replaced).
_RESPONSES_PARAMS = (
    ("messages", "input"),
    ("max_completion_tokens", "max_output_tokens"),
    ("max_tokens", "max_output_tokens"),
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
)


def responses_param(param: str | None) -> str | None:
    """The Responses request's field that ``param`` (a chat request's) came from."""
    if param is None:
        return None
    for chat, ours in _RESPONSES_PARAMS:
        if param == chat or param.startswith(f"{chat}."):
            return ours + param[len(chat) :]
    if param.startswith("tools.") and ".function." in param:
        return param.replace(".function.", ".", 1)
    return param


def as_responses_error(error: GatewayError) -> GatewayError:
    """``error`` naming the Responses request's field rather than the chat request's."""
    error.param = responses_param(error.param)
    return error


def translate(
    request: ResponsesRequest,
    context: list[Item],
    response_id: str | None = None,
) -> Translated:
    """``request`` as the chat request that runs it, after the chain's earlier ``context``.
    The instructions of earlier responses are not carried over (as at OpenAI)."""
    input_items = stored_items(request)
    streamed = request.stream or request.background
    body: dict[str, Any] = {
        "model": request.model,
        "messages": chat_messages(request.instructions, [*context, *input_items]),
        "max_completion_tokens": request.max_output_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "user": request.user,
        "tools": _tools(request),
        "tool_choice": _tool_choice(request),
        "parallel_tool_calls": request.parallel_tool_calls,
        # A background response streams too, in both roles: its counts come as it runs, and
        # a cancel charges what was produced (app/serving/responses/background.py).
        "stream": streamed,
        # Usage on the last chunk: the Response's usage.
        "stream_options": {"include_usage": True} if streamed else None,
    }
    text_format = request.text.format if request.text is not None else None
    if text_format is not None:
        body["response_format"] = text_format.response_format()
    try:
        chat = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first.get("loc", ()))
        raise BadRequestError(first["msg"], param=responses_param(param)) from None
    return Translated(
        response_id=response_id or new_id("resp"),
        created_at=int(time.time()),
        request=request,
        chat=chat,
        input_items=input_items,
        context=context,
    )


def echoed_fields(request: ResponsesRequest) -> Mapping[str, Any]:
    """What a Response repeats of the request that made it."""
    text_format = request.text.format if request.text is not None else None
    choice = request.tool_choice
    return {
        "instructions": request.instructions,
        "parallel_tool_calls": request.parallel_tool_calls,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "max_output_tokens": request.max_output_tokens,
        "tool_choice": choice.model_dump()
        if choice is not None and not isinstance(choice, str)
        else (choice or "auto"),
        "tools": [tool.model_dump(exclude_none=True) for tool in request.tools or []],
        "text": {
            "format": text_format.model_dump(by_alias=True, exclude_none=True)
            if text_format is not None
            else {"type": "text"}
        },
        "previous_response_id": request.previous_response_id,
        "store": request.store,
        "background": request.background,
        "metadata": request.metadata or {},
        "user": request.user,
    }
