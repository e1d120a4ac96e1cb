"""Stream chunks as JSON text, without a pydantic model per token.

Building and dumping a chunk model (three models for a chat chunk) for every streamed token
was most of the gateway's own cost per token. Every chunk of one stream shares its envelope
(id, object, created, model, usage), so :class:`ChunkEnvelope` dumps it once, from the same
models the rest of the stream uses, and the per-token part (a choice of a few fields) is
formatted directly. The tests hold each encoder to its model's ``model_dump_json``.
"""

from __future__ import annotations

from collections.abc import Callable
from json.encoder import encode_basestring
from typing import Final

from pydantic import BaseModel

_PLACEHOLDER: Final = '"choices":[]'
_NO_USAGE: Final = '"usage":null'
_TEXT_MARK: Final = "\x00text\x00"


def json_string(text: str) -> str:
    """``text`` as a JSON string literal (UTF-8 kept, as pydantic writes it)."""
    return encode_basestring(text)


def json_optional_string(text: str | None) -> str:
    return "null" if text is None else encode_basestring(text)


def json_optional_model(model: BaseModel | None) -> str:
    return "null" if model is None else model.model_dump_json()


ChoiceEncoder = Callable[[int, str, BaseModel | None, str | None], str]
"""``(index, text, logprobs, finish_reason) -> the choice's JSON``."""


class StreamChunks:
    """The chunks of one stream, each with one choice, as JSON: ``chunks(index, text,
    logprobs, finish_reason)`` is the JSON of ``envelope`` (a chunk model with an empty
    ``choices`` list) holding that choice, as ``model_dump_json`` writes it.

    Most chunks carry only text (no logprobs, no finish reason): for those, the JSON around
    the text is formatted once per choice index, and a chunk is one string encoding."""

    def __init__(self, envelope: BaseModel, choice: ChoiceEncoder, n: int) -> None:
        text = envelope.model_dump_json()
        if getattr(envelope, "choices", None) != [] or text.count(_PLACEHOLDER) != 1:
            raise ValueError("the envelope must have an empty `choices` list")
        head, tail = text.split(_PLACEHOLDER)
        self._head = f'{head}"choices":['
        self._tail = f"]{tail}"
        self._choice = choice
        self._around_text = [self._split_at_text(i) for i in range(n)]
        # The envelope with no choices, split where its usage goes (where it has a null one).
        self._around_usage = text.rsplit(_NO_USAGE, 1) if _NO_USAGE in tail else None

    def __call__(
        self, index: int, text: str, logprobs: BaseModel | None, finish_reason: str | None
    ) -> str:
        if logprobs is None and finish_reason is None:
            around = self._around_text[index]
            if around is not None:
                return around[0] + encode_basestring(text) + around[1]
        return self.wrap(self._choice(index, text, logprobs, finish_reason))

    def wrap(self, choice_json: str) -> str:
        """The chunk holding one choice, ``choice_json`` as encoded."""
        return f"{self._head}{choice_json}{self._tail}"

    def usage(self, usage: BaseModel) -> str:
        """The stream's last chunk: no choices, and ``usage``."""
        if self._around_usage is None:
            raise ValueError("the envelope has no null `usage` to fill")
        before, after = self._around_usage
        return f'{before}"usage":{usage.model_dump_json()}{after}'

    def _split_at_text(self, index: int) -> tuple[str, str] | None:
        """The text-only chunk of ``index`` before and after its text; ``None`` where the
        envelope holds the marker too (a model named so), and the text cannot be found."""
        marked = self.wrap(self._choice(index, _TEXT_MARK, None, None))
        parts = marked.split(json_string(_TEXT_MARK))
        return (parts[0], parts[1]) if len(parts) == 2 else None


def chat_choice(
    index: int, content: str, logprobs: BaseModel | None, finish_reason: str | None
) -> str:
    """A :class:`~app.protocol.ChatChunkChoice` whose delta carries only ``content``."""
    return (
        f'{{"index":{index},"delta":{{"role":null,"content":{json_string(content)},'
        f'"tool_calls":null}},"logprobs":{json_optional_model(logprobs)},'
        f'"finish_reason":{json_optional_string(finish_reason)}}}'
    )


def chat_opening_choice(index: int) -> str:
    """A stream's first :class:`~app.protocol.ChatChunkChoice` of ``index``: the assistant's
    role, no content yet."""
    return (
        f'{{"index":{index},"delta":{{"role":"assistant","content":"","tool_calls":null}},'
        '"logprobs":null,"finish_reason":null}'
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
