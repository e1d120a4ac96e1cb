"""Stream chunks as JSON text, without a pydantic model per token.

Building and dumping a chunk model (three models for a chat chunk) for every streamed token
was most of the gateway's own cost per token. Every chunk of one stream shares its envelope
(id, object, created, model, usage), so :class:`ChunkEnvelope` dumps it once, from the same
models the rest of the stream uses, and the per-token part (a choice of a few fields) is
formatted directly. The tests hold each encoder to its model's ``model_dump_json``.
"""

from __future__ import annotations

import json
from typing import Final

from pydantic import BaseModel

_PLACEHOLDER: Final = '"choices":[]'
_STRING = json.JSONEncoder(ensure_ascii=False)


def json_string(text: str) -> str:
    """``text`` as a JSON string literal (UTF-8 kept, as pydantic writes it)."""
    return _STRING.encode(text)


def json_optional_string(text: str | None) -> str:
    return "null" if text is None else _STRING.encode(text)


def json_optional_model(model: BaseModel | None) -> str:
    return "null" if model is None else model.model_dump_json()


class ChunkEnvelope:
    """A stream's chunk with its ``choices`` left open: ``wrap(choice_json)`` is the JSON of
    the envelope model with that one choice, as ``model_dump_json`` writes it."""

    def __init__(self, envelope: BaseModel) -> None:
        text = envelope.model_dump_json()
        if getattr(envelope, "choices", None) != [] or text.count(_PLACEHOLDER) != 1:
            raise ValueError("the envelope must have an empty `choices` list")
        head, tail = text.split(_PLACEHOLDER)
        self._head = f'{head}"choices":['
        self._tail = f"]{tail}"

    def wrap(self, choice_json: str) -> str:
        return f"{self._head}{choice_json}{self._tail}"


def chat_choice(
    index: int, content: str, logprobs: BaseModel | None, finish_reason: str | None
) -> str:
    """A :class:`~app.protocol.ChatChunkChoice` whose delta carries only ``content``."""
    return (
        f'{{"index":{index},"delta":{{"role":null,"content":{json_string(content)},'
        f'"tool_calls":null}},"logprobs":{json_optional_model(logprobs)},'
        f'"finish_reason":{json_optional_string(finish_reason)}}}'
    )


def completion_choice(
    index: int, text: str, logprobs: BaseModel | None, finish_reason: str | None
) -> str:
    """A :class:`~app.protocol.CompletionChoice`."""
    return (
        f'{{"index":{index},"text":{json_string(text)},'
        f'"logprobs":{json_optional_model(logprobs)},'
        f'"finish_reason":{json_optional_string(finish_reason)}}}'
    )
