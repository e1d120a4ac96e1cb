"""A chat stream's one choice as typed pieces of text, for a reader that writes its own events
(the Responses API's): what the engine produced, without the chat chunks' JSON to parse back.

A chat service that can stream so (:class:`TextStreaming`) gives, for a request with one
choice, no tools and no logprobs, a :class:`TextPiece` per engine output (in-process) or
upstream chunk (the front role), then one :class:`TextEnd` with the counts. A failure is
raised, whenever it comes. Closing the stream before its end aborts the request, as closing a
chat stream does.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from app.protocol import ChatCompletionRequest


@dataclass(frozen=True, slots=True)
class TextPiece:
    """The next text of the choice; ``finish_reason`` (chat's: ``stop``, ``length``...) on
    its last."""

    text: str
    finish_reason: str | None


@dataclass(frozen=True, slots=True)
class TextEnd:
    """The stream's end: the tokens it cost."""

    prompt_tokens: int
    completion_tokens: int


TextStream = AsyncGenerator[TextPiece | TextEnd, None]


def streams_as_text(request: ChatCompletionRequest) -> bool:
    """Whether ``request``'s stream is one choice of plain text: no tools, no logprobs."""
    return request.n == 1 and not request.tools and request.num_logprobs is None


@runtime_checkable
class TextStreaming(Protocol):
    """A chat service that streams a request :func:`streams_as_text` accepts as text."""

    def text_stream(self, request: ChatCompletionRequest, run: Any) -> TextStream:
        """The request's output as :class:`TextPiece` s, then a :class:`TextEnd`."""
        ...
