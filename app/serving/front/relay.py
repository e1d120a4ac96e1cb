"""The upstream's streamed chunks relayed without a model per token.

Reading each chunk into the gateway's response model and writing it out again was most of a
front's cost per streamed token. Most chunks have one shape: one choice carrying text (no
role, no tool calls, no logprobs), and the usage counts the front asks for. For those,
:class:`ChunkRelay` reads only what billing and the stream's end need (the counts, the
choice's index and finish reason) with the ``json`` module, and writes the chunk as the
model would write it, with the gateway's id and the tenant's model name and without the
counts, through :class:`~app.serving.chunk_encoding.StreamChunks` (the envelope
once per stream, the text the only encoding per token).

Anything else (the opening role chunk, tool calls, logprobs, the usage chunk, an error, a
value the model would coerce or refuse) is not relayed: :meth:`ChunkRelay.read` gives
``None`` and the chunk takes the model's way, so the client sees exactly what the model
would have made of it. The tests hold the relay to the model's output for both shapes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final, Literal

from app.protocol import ChatCompletionChunk, Completion
from app.serving.chunk_encoding import (
    ChoiceEncoder,
    StreamChunks,
    chat_choice,
    completion_choice,
)

ChunkKind = Literal["chat", "completion"]

_FINISH_REASONS: Final = frozenset({"stop", "length", "tool_calls"})
_OBJECT: Final[dict[ChunkKind, str]] = {
    "chat": "chat.completion.chunk",
    "completion": "text_completion",
}


@dataclass(frozen=True, slots=True)
class Counts:
    """A chunk's usage counts: the tokens so far."""

    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class ChoiceEnd:
    """Of a relayed choice, what the stream's accounting reads."""

    index: int
    finish_reason: str | None


@dataclass(frozen=True, slots=True)
class RelayedChunk:
    """An upstream chunk, ready to send: ``event`` is its SSE event, written as the model
    would write it with the gateway's id and the tenant's model, and no usage."""

    usage: Counts | None
    choices: tuple[ChoiceEnd]
    event: str


class ChunkRelay:
    """The chunks of one stream of ``kind`` with ``choices`` choices, relayed with id
    ``chunk_id`` and model ``model``."""

    def __init__(self, kind: ChunkKind, chunk_id: str, model: str, choices: int) -> None:
        self._choices = choices
        self._chat = kind == "chat"
        self._object = _OBJECT[kind]
        self._id = chunk_id
        self._model = model
        self._created: int | None = None
        self._chunks: StreamChunks | None = None

    def read(self, data: bytes) -> RelayedChunk | None:
        """``data`` (one event's JSON) relayed, or ``None`` where it is not of the common
        shape, and must be read as the model."""
        if b"\\ud" in data or b"\\uD" in data:  # a surrogate escape: the model's judgement
            return None
        try:
            chunk = json.loads(data)
        except ValueError:
            return None
        if not isinstance(chunk, dict) or chunk.get("object") != self._object:
            return None
        created, choices = chunk.get("created"), chunk.get("choices")
        if type(created) is not int or type(choices) is not list or len(choices) != 1:
            return None
        if type(chunk.get("id")) is not str or type(chunk.get("model")) is not str:
            return None
        choice = choices[0]
        if type(choice) is not dict:
            return None
        index, reason = choice.get("index"), choice.get("finish_reason")
        if type(index) is not int or not 0 <= index < self._choices:
            return None
        if choice.get("logprobs") is not None:
            return None
        if reason is not None and reason not in _FINISH_REASONS:
            return None
        text = self._text(choice)
        if text is None:
            return None
        usage = chunk.get("usage")
        counts = None
        if usage is not None:
            counts = _counts(usage)
            if counts is None:
                return None
        encoded = self._encoder(created)(index, text, None, reason)
        return RelayedChunk(counts, (ChoiceEnd(index, reason),), f"data: {encoded}\n\n")

    def _text(self, choice: dict[str, object]) -> str | None:
        if not self._chat:
            text = choice.get("text")
            return text if type(text) is str else None
        delta = choice.get("delta")
        if type(delta) is not dict:
            return None
        if delta.get("role") is not None or delta.get("tool_calls") is not None:
            return None
        content = delta.get("content")
        return content if type(content) is str else None

    def _encoder(self, created: int) -> StreamChunks:
        if self._chunks is None or created != self._created:
            envelope: ChatCompletionChunk | Completion
            choice: ChoiceEncoder
            if self._chat:
                envelope = ChatCompletionChunk(
                    id=self._id, created=created, model=self._model, choices=[]
                )
                choice = chat_choice
            else:
                envelope = Completion(id=self._id, created=created, model=self._model, choices=[])
                choice = completion_choice
            self._chunks = StreamChunks(envelope, choice, self._choices)
            self._created = created
        return self._chunks


def _counts(usage: object) -> Counts | None:
    if type(usage) is not dict:
        return None
    prompt, completion, total = (
        usage.get("prompt_tokens"),
        usage.get("completion_tokens"),
        usage.get("total_tokens"),
    )
    if type(prompt) is not int or type(completion) is not int or type(total) is not int:
        return None
    return Counts(prompt, completion)
