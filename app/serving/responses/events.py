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
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from typing import Any

from app.errors import GatewayError
from app.serving.lifecycle.runs import ClientDisconnected
from app.serving.preparation.responses import Translated, new_id
from app.serving.responses import output
from app.serving.responses.output import Body, json_value
from app.serving.text_stream import TextPiece, TextStream

logger = logging.getLogger(__name__)

Finish = Callable[[Body], Awaitable[None]]
"""Awaited with the finished Response, as JSON-ready data (what its model dumps)."""
Failed = Callable[[Body], None]
"""Called with the error (an OpenAI error body) of a stream that ends with
``response.failed``."""

_EMPTY_PART = '{"type": "output_text", "text": "", "annotations": [], "logprobs": []}'
"""An empty ``output_text`` part, as :meth:`_Events.event` writes it."""


def _output_text(text: str) -> Body:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


@dataclass
class _Call:
    output_index: int
    item: Body
    head: str
    """The item's JSON text up to its status: its id and type."""
    tail: str
    """The item's JSON text from its call id to its arguments' key."""
    where: str
    """Its events' ``item_id`` and ``output_index``, as JSON text."""
    arguments: list[str] = field(default_factory=list)


class _Events:
    """The events of one response, numbered as they are made.

    Its output items are JSON-ready data (the shapes of :mod:`app.protocol.responses_api`'s
    models, as they dump), and its events, but a failure's, are written around their ids,
    indexes and texts (each encoded once) rather than encoded whole: the same JSON as
    :meth:`event` writes. So are its Responses (:class:`~.output.ResponseText`), and each
    item's JSON text is kept as it is done, for the last one."""

    def __init__(self, translated: Translated, on_failure: Failed | None = None) -> None:
        self.translated = translated
        self.on_failure = on_failure
        self.sequence = 0
        self.items: list[Body] = []
        self.done_items: dict[int, str] = {}
        """The JSON text of each output item that is done, by its output index."""
        self.response_text = output.ResponseText(translated)
        self.message: Body | None = None
        self.message_index = 0
        """The open message's output index."""
        self.text: list[str] = []
        self.calls: dict[int, _Call] = {}
        self.open_calls: list[_Call] = []
        self.finish_reason: str | None = None
        self.usage: Body | None = None
        self.usage_text: str | None = None
        self.delta_template = ("", "", "")
        """The open message's text delta event, cut where its sequence number and text go."""
        self.ended = False
        """Whether the final event has been made: nothing follows it."""

    def event(self, kind: str, **fields: Any) -> str:
        body = json.dumps({"type": kind, "sequence_number": self.sequence, **fields})
        self.sequence += 1
        return f"event: {kind}\ndata: {body}\n\n"

    def written(self, kind: str, fields: str) -> str:
        """The next event of type ``kind`` whose other ``fields`` are JSON text already
        (``, "name": value`` each), as :meth:`event` would write it."""
        sequence = self.sequence
        self.sequence += 1
        return (
            f'event: {kind}\ndata: {{"type": "{kind}", "sequence_number": {sequence}{fields}}}\n\n'
        )

    def text_delta(self, text: str) -> str:
        """The open message's next ``response.output_text.delta``, as :meth:`event` writes
        it: the JSON around its sequence number and text is formatted once per message."""
        self.text.append(text)
        sequence = self.sequence
        self.sequence += 1
        head, middle, tail = self.delta_template
        return f"{head}{sequence}{middle}{encode_basestring_ascii(text)}{tail}"

    def counted(self, prompt_tokens: int, completion_tokens: int) -> None:
        """The response's usage, as the chat service counted it."""
        self.usage = output.usage_body(prompt_tokens, completion_tokens)
        self.usage_text = output.usage_json(prompt_tokens, completion_tokens)

    def response(self, status: str, error: Body | None = None) -> Body:
        return output.response_body(
            self.translated,
            list(self.items),
            status=status,
            finish_reason=self.finish_reason,
            token_usage=self.usage,
            error=error,
        )

    def opening(self) -> list[str]:
        # Both events show the same Response: written once.
        opened = f', "response": {self.response_text.write([], status="in_progress")}'
        return [
            self.written("response.created", opened),
            self.written("response.in_progress", opened),
        ]

    def chunk(self, chunk: dict[str, Any]) -> list[str]:
        events: list[str] = []
        if chunk.get("usage") is not None:
            used = chunk["usage"]
            self.counted(used["prompt_tokens"], used["completion_tokens"])
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
            events += self._close_calls()
            item_id = new_id("msg")
            index = self.message_index = len(self.items)
            self.message = {
                "id": item_id,
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            self.items.append(self.message)
            self.text = []
            quoted = encode_basestring_ascii(item_id)
            item = (
                f'{{"id": {quoted}, "type": "message", "role": "assistant", '
                '"status": "in_progress", "content": []}'
            )
            events.append(
                self.written(
                    "response.output_item.added", f', "output_index": {index}, "item": {item}'
                )
            )
            events.append(
                self.written(
                    "response.content_part.added",
                    f', "item_id": {quoted}, "output_index": {index}, "content_index": 0, '
                    f'"part": {_EMPTY_PART}',
                )
            )
            self.delta_template = _delta_template(item_id, index)
        if text:
            events.append(self.text_delta(text))
        return events

    def _call(self, delta: dict[str, Any]) -> list[str]:
        events: list[str] = []
        function = delta.get("function") or {}
        call = self.calls.get(delta["index"])
        if call is not None and call not in self.open_calls:
            # Closed when the next call began: vLLM's tool parsers stream one call after
            # another, so its arguments were whole. Nothing sent can be taken back.
            raise GatewayError("A tool call's arguments came after the next call had begun.")
        if call is None:
            # An item is done before the next one is added, as OpenAI streams them: the
            # tool parser has finished a call's arguments when it starts the next call.
            events += self._close_message()
            events += self._close_calls()
            item_id, call_id = new_id("fc"), delta.get("id") or new_id("call")
            name = function.get("name") or ""
            item = {
                "id": item_id,
                "type": "function_call",
                "status": "in_progress",
                "call_id": call_id,
                "name": name,
                "arguments": "",
            }
            index = len(self.items)
            self.items.append(item)
            quoted = json_value(item_id)
            call = self.calls[delta["index"]] = _Call(
                index,
                item,
                head=f'{{"id": {quoted}, "type": "function_call", "status": ',
                tail=(
                    f', "call_id": {json_value(call_id)}, "name": {json_value(name)}, "arguments": '
                ),
                where=f', "item_id": {quoted}, "output_index": {index}',
            )
            self.open_calls.append(call)
            events.append(
                self.written(
                    "response.output_item.added",
                    f', "output_index": {index}, "item": {call.head}"in_progress"{call.tail}""}}',
                )
            )
        piece = function.get("arguments")
        if piece:
            call.arguments.append(piece)
            events.append(
                self.written(
                    "response.function_call_arguments.delta",
                    f'{call.where}, "delta": {json_value(piece)}',
                )
            )
        return events

    def _close_message(self) -> list[str]:
        message = self.message
        if message is None:
            return []
        self.message = None
        index = self.message_index
        text = "".join(self.text)
        status = "incomplete" if self.finish_reason == "length" else "completed"
        message["status"] = status
        message["content"] = [_output_text(text)]
        quoted, encoded = encode_basestring_ascii(message["id"]), encode_basestring_ascii(text)
        part = f'{{"type": "output_text", "text": {encoded}, "annotations": [], "logprobs": []}}'
        item = (
            f'{{"id": {quoted}, "type": "message", "role": "assistant", "status": "{status}", '
            f'"content": [{part}]}}'
        )
        where = f', "item_id": {quoted}, "output_index": {index}, "content_index": 0'
        self.done_items[index] = item
        return [
            self.written(
                "response.output_text.done", f'{where}, "text": {encoded}, "logprobs": []'
            ),
            self.written("response.content_part.done", f'{where}, "part": {part}'),
            self.written("response.output_item.done", f', "output_index": {index}, "item": {item}'),
        ]

    def closing(self) -> list[str]:
        """The events that close every open item; an output with none gets an empty message,
        as a non-streamed Response would have."""
        events = []
        if not self.items:
            events += self._text("")
        return events + self._close_message() + self._close_calls()

    def _close_calls(self) -> list[str]:
        events = []
        for call in self.open_calls:
            arguments = "".join(call.arguments)
            call.item["arguments"] = arguments
            call.item["status"] = "completed"
            encoded = json_value(arguments)
            item = self.done_items[call.output_index] = (
                f'{call.head}"completed"{call.tail}{encoded}}}'
            )
            events.append(
                self.written(
                    "response.function_call_arguments.done",
                    f'{call.where}, "arguments": {encoded}',
                )
            )
            events.append(
                self.written(
                    "response.output_item.done",
                    f', "output_index": {call.output_index}, "item": {item}',
                )
            )
        self.open_calls = []
        return events

    def finished(self) -> Body:
        """The finished Response, every item done by then (:meth:`closing`)."""
        return self.response("completed")

    def final(self, made: Body) -> str:
        """The stream's last event, for ``made`` (:meth:`finished`) once it is kept: written
        of the items' JSON texts. A failure to keep it ends the stream with
        ``response.failed`` instead, numbered next."""
        kind = "response.incomplete" if made["status"] == "incomplete" else "response.completed"
        self.ended = True
        written = self.response_text.write(
            [self.done_items[index] for index in range(len(self.items))],
            status="completed",
            finish_reason=self.finish_reason,
            token_usage=self.usage_text,
        )
        return self.written(kind, f', "response": {written}')

    def failed(self, body: dict[str, Any]) -> str:
        error = output.error_of(body).model_dump()
        self.ended = True
        if self.on_failure is not None:
            self.on_failure(body)
        return self.event("response.failed", response=self.response("failed", error=error))


_DELTA = "response.output_text.delta"


def _delta_template(item_id: str, output_index: int) -> tuple[str, str, str]:
    """A ``response.output_text.delta`` event of message ``item_id`` as :meth:`_Events.event`
    writes it, cut around its sequence number and its text."""
    head = f'event: {_DELTA}\ndata: {{"type": "{_DELTA}", "sequence_number": '
    middle = (
        f', "item_id": {encode_basestring_ascii(item_id)}, "output_index": {output_index}, '
        '"content_index": 0, "delta": '
    )
    return head, middle, ', "logprobs": []}\n\n'


def _payloads(text: str) -> list[str]:
    return [line.removeprefix("data: ") for line in text.split("\n") if line.startswith("data: ")]


def _failed(events: _Events, exc: Exception) -> str:
    """The ``response.failed`` event that ends a stream ``exc`` broke: a gateway error's own
    body (the tenant's storage full, say), else a server error's."""
    if isinstance(exc, GatewayError):
        return events.failed(exc.body())
    logger.exception("responses stream failed")
    return events.failed({"error": {"message": "The server had an error while streaming."}})


async def response_events(
    translated: Translated,
    chat_events: AsyncIterator[str],
    finish: Finish,
    failed: Failed | None = None,
) -> AsyncGenerator[str]:
    """``chat_events`` (a chat service's stream) as the Response's events. ``finish`` is
    awaited with the finished Response before its last event (where it is stored: a client
    that continues the chain on that event finds it). A failure before the first chat event
    is raised, for the response to get its own status; any later one ends the stream with
    ``response.failed``, its error given to ``failed`` too."""
    events = _Events(translated, failed)
    opened = False
    unsent: list[str] = []  # the items' last events while the Response is kept
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
                    unsent = [*out, *events.closing()]
                    made = events.finished()
                    await finish(made)
                    out, unsent = [*unsent, events.final(made)], []
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
    except Exception as exc:
        if not opened or events.ended:
            raise
        yield "".join([*unsent, _failed(events, exc)])
    finally:
        await chat_events.aclose()  # type: ignore[attr-defined]


async def text_events(
    translated: Translated, pieces: TextStream, finish: Finish, failed: Failed | None = None
) -> AsyncGenerator[str]:
    """``pieces`` (a chat service's text stream) as the Response's events. ``finish`` is
    awaited with the finished Response before its last event, as for :func:`response_events`.
    A failure before the first piece is raised, for the response to get its own status; any
    later one ends the stream with ``response.failed``, its error given to ``failed`` too."""
    events = _Events(translated, failed)
    opened = False
    unsent: list[str] = []  # the items' last events while the Response is kept
    try:
        async for piece in pieces:
            if not isinstance(piece, TextPiece):  # the end: its counts
                events.counted(piece.prompt_tokens, piece.completion_tokens)
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
        unsent = [*out, *events.closing()]
        made = events.finished()
        await finish(made)
        yield "".join([*unsent, events.final(made)])
    except ClientDisconnected:
        raise
    except Exception as exc:
        if not opened or events.ended:
            raise
        yield "".join([*unsent, _failed(events, exc)])
    finally:
        await pieces.aclose()
