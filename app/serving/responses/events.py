"""A chat completion's stream as the Responses API's events.

OpenAI's sequence: ``response.created`` and ``response.in_progress`` with the first output;
per output item ``response.output_item.added``, its content (``response.content_part.added``,
``response.output_text.delta``... or ``response.function_call_arguments.delta``...) and
``response.output_item.done``; then one of ``response.completed``, ``response.incomplete`` or
``response.failed``. Every event carries a ``sequence_number``, counted from 0.

Two sources, one sequence. A request whose chat stream is plain text (most) is read from the
chat service's typed pieces (:func:`text_events`, :mod:`app.serving.text_stream`): what the
engine produced, with no chat chunk written to be parsed back, and each text delta one string
formatted around its text. One with tools is read back from the chat service's server-sent
events (:func:`response_events`), where its calls are assembled.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from typing import Any

from app.errors import GatewayError
from app.protocol.responses_api import (
    FunctionCallOutput,
    OutputItem,
    OutputMessage,
    OutputText,
    ResponseError,
    ResponseObject,
    ResponseUsage,
)
from app.serving.lifecycle.runs import ClientDisconnected
from app.serving.preparation.responses import Translated, new_id
from app.serving.responses import output
from app.serving.text_stream import TextPiece, TextStream

logger = logging.getLogger(__name__)

Finish = Callable[[ResponseObject], Awaitable[None]]


@dataclass
class _Call:
    output_index: int
    item: FunctionCallOutput
    arguments: list[str] = field(default_factory=list)


class _Events:
    """The events of one response, numbered as they are made."""

    def __init__(self, translated: Translated) -> None:
        self.translated = translated
        self.sequence = 0
        self.items: list[OutputItem] = []
        self.message: OutputMessage | None = None
        self.text: list[str] = []
        self.calls: dict[int, _Call] = {}
        self.open_calls: list[_Call] = []
        self.finish_reason: str | None = None
        self.usage: ResponseUsage | None = None
        self.delta_template = ("", "", "")
        """The open message's text delta event, cut where its sequence number and text go."""
        self.ended = False
        """Whether the final event has been made: nothing follows it."""

    def event(self, kind: str, **fields: Any) -> str:
        body = json.dumps({"type": kind, "sequence_number": self.sequence, **fields})
        self.sequence += 1
        return f"event: {kind}\ndata: {body}\n\n"

    def text_delta(self, text: str) -> str:
        """The open message's next ``response.output_text.delta``, as :meth:`event` writes
        it: the JSON around its sequence number and text is formatted once per message."""
        self.text.append(text)
        sequence = self.sequence
        self.sequence += 1
        head, middle, tail = self.delta_template
        return f"{head}{sequence}{middle}{encode_basestring_ascii(text)}{tail}"

    def response(self, status: str, **extra: Any) -> dict[str, Any]:
        made = output.response(
            self.translated,
            self.items,
            status=status,
            finish_reason=self.finish_reason,
            token_usage=self.usage,
            **extra,
        )
        return made.model_dump(mode="json")

    def opening(self) -> list[str]:
        opened = self.response("in_progress")  # both events show the same Response
        return [
            self.event("response.created", response=opened),
            self.event("response.in_progress", response=opened),
        ]

    def chunk(self, chunk: dict[str, Any]) -> list[str]:
        events: list[str] = []
        if chunk.get("usage") is not None:
            used = chunk["usage"]
            self.usage = output.usage(used["prompt_tokens"], used["completion_tokens"])
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                events += self._text(delta["content"])
            for call in delta.get("tool_calls") or []:
                events += self._call(call)
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
        return events

    def _text(self, text: str) -> list[str]:
        events = []
        if self.message is None:
            self.message = OutputMessage(id=new_id("msg"), status="in_progress", content=[])
            events.append(self._added(self.message))
            self.delta_template = _delta_template(self.message.id, len(self.items) - 1)
            events.append(
                self.event(
                    "response.content_part.added",
                    item_id=self.message.id,
                    output_index=len(self.items) - 1,
                    content_index=0,
                    part=OutputText(text="").model_dump(),
                )
            )
        if text:
            events.append(self.text_delta(text))
        return events

    def _added(self, item: OutputItem) -> str:
        self.items.append(item)
        return self.event(
            "response.output_item.added",
            output_index=len(self.items) - 1,
            item=item.model_dump(mode="json"),
        )

    def _call(self, delta: dict[str, Any]) -> list[str]:
        events: list[str] = []
        function = delta.get("function") or {}
        call = self.calls.get(delta["index"])
        if call is None:
            events += self._close_message()
            item = FunctionCallOutput(
                id=new_id("fc"),
                status="in_progress",
                call_id=delta.get("id") or new_id("call"),
                name=function.get("name") or "",
                arguments="",
            )
            call = self.calls[delta["index"]] = _Call(len(self.items), item)
            self.open_calls.append(call)
            events.append(self._added(item))
        piece = function.get("arguments")
        if piece:
            call.arguments.append(piece)
            events.append(
                self.event(
                    "response.function_call_arguments.delta",
                    item_id=call.item.id,
                    output_index=call.output_index,
                    delta=piece,
                )
            )
        return events

    def _close_message(self) -> list[str]:
        message = self.message
        if message is None:
            return []
        self.message = None
        index = self.items.index(message)
        text = "".join(self.text)
        part = OutputText(text=text)
        message.content = [part]
        message.status = "incomplete" if self.finish_reason == "length" else "completed"
        return [
            self.event(
                "response.output_text.done",
                item_id=message.id,
                output_index=index,
                content_index=0,
                text=text,
                logprobs=[],
            ),
            self.event(
                "response.content_part.done",
                item_id=message.id,
                output_index=index,
                content_index=0,
                part=part.model_dump(),
            ),
            self._done(message, index),
        ]

    def _done(self, item: OutputItem, index: int) -> str:
        return self.event(
            "response.output_item.done", output_index=index, item=item.model_dump(mode="json")
        )

    def closing(self) -> list[str]:
        """The events that close every open item; an output with none gets an empty message,
        as a non-streamed Response would have."""
        events = []
        if not self.items:
            events += self._text("")
        events += self._close_message()
        for call in self.open_calls:
            arguments = "".join(call.arguments)
            call.item.arguments = arguments
            call.item.status = "completed"
            events.append(
                self.event(
                    "response.function_call_arguments.done",
                    item_id=call.item.id,
                    output_index=call.output_index,
                    arguments=arguments,
                )
            )
            events.append(self._done(call.item, call.output_index))
        self.open_calls = []
        return events

    def final(self) -> tuple[ResponseObject, str]:
        made = output.response(
            self.translated,
            self.items,
            status="completed",
            finish_reason=self.finish_reason,
            token_usage=self.usage,
        )
        kind = "response.incomplete" if made.status == "incomplete" else "response.completed"
        self.ended = True
        return made, self.event(kind, response=made.model_dump(mode="json"))

    def failed(self, body: dict[str, Any]) -> str:
        error: ResponseError = output.error_of(body)
        self.ended = True
        return self.event("response.failed", response=self.response("failed", error=error))


_MARK = "\x00mark\x00"


def _delta_template(item_id: str, output_index: int) -> tuple[str, str, str]:
    """A ``response.output_text.delta`` event of message ``item_id`` as :meth:`_Events.event`
    writes it, cut around its sequence number and its text."""
    kind = "response.output_text.delta"
    fields = {
        "type": kind,
        "sequence_number": _MARK,
        "item_id": item_id,
        "output_index": output_index,
        "content_index": 0,
        "delta": _MARK,
        "logprobs": [],
    }
    head, middle, tail = f"event: {kind}\ndata: {json.dumps(fields)}\n\n".split(json.dumps(_MARK))
    return head, middle, tail


def _payloads(text: str) -> list[str]:
    return [line.removeprefix("data: ") for line in text.split("\n") if line.startswith("data: ")]


async def response_events(
    translated: Translated, chat_events: AsyncIterator[str], finish: Finish
) -> AsyncIterator[str]:
    """``chat_events`` (a chat service's stream) as the Response's events. ``finish`` is
    awaited with the finished Response before its last event (where it is stored: a client
    that continues the chain on that event finds it). A failure before the first chat event
    is raised, for the response to get its own status; any later one ends the stream with
    ``response.failed``."""
    events = _Events(translated)
    opened = False
    try:
        async for text in chat_events:
            out: list[str] = []
            for payload in _payloads(text):
                if events.ended:
                    break
                if not opened:
                    out += events.opening()
                    opened = True
                if payload == "[DONE]":
                    out += events.closing()
                    made, last = events.final()
                    await finish(made)
                    out.append(last)
                    continue
                chunk = json.loads(payload)
                if "error" in chunk:
                    out.append(events.failed(chunk))
                    continue
                out += events.chunk(chunk)
            if out:
                yield "".join(out)
    except ClientDisconnected:
        raise
    except Exception:
        if not opened or events.ended:
            raise
        logger.exception("responses stream failed")
        failure = {"error": {"message": "The server had an error while streaming."}}
        yield events.failed(failure)
    finally:
        await chat_events.aclose()  # type: ignore[attr-defined]


async def text_events(
    translated: Translated, pieces: TextStream, finish: Finish
) -> AsyncIterator[str]:
    """``pieces`` (a chat service's text stream) as the Response's events. ``finish`` is
    awaited with the finished Response before its last event, as for :func:`response_events`.
    A failure before the first piece is raised, for the response to get its own status; any
    later one ends the stream with ``response.failed``."""
    events = _Events(translated)
    opened = False
    try:
        async for piece in pieces:
            if not isinstance(piece, TextPiece):  # the end: its counts
                events.usage = output.usage(piece.prompt_tokens, piece.completion_tokens)
                continue
            if opened and events.message is not None and piece.finish_reason is None:
                if piece.text:  # most pieces: the message's next text
                    yield events.text_delta(piece.text)
                continue
            out = [] if opened else events.opening()
            opened = True
            if piece.text or events.message is None:
                out += events._text(piece.text)
            if piece.finish_reason is not None:
                events.finish_reason = piece.finish_reason
            yield "".join(out)
        out = [] if opened else events.opening()
        opened = True
        out += events.closing()
        made, last = events.final()
        await finish(made)
        out.append(last)
        yield "".join(out)
    except ClientDisconnected:
        raise
    except Exception as exc:
        if not opened or events.ended:
            raise
        if isinstance(exc, GatewayError):
            yield events.failed(exc.body())
        else:
            logger.exception("responses stream failed")
            yield events.failed({"error": {"message": "The server had an error while streaming."}})
    finally:
        await pieces.aclose()
