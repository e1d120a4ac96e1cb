"""The pre-encoded stream chunks are the JSON their models would dump, whatever the text."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.protocol import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatDelta,
    ChatLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    Usage,
)
from app.protocol.responses import TokenLogprob, TopLogprob
from app.serving.chunk_encoding import (
    StreamChunks,
    chat_choice,
    chat_opening_choice,
    completion_choice,
)

TEXTS = ["", "a", 'quote " and \\ backslash', "line\nbreak\ttab\r", "é ✓ 日本 🙂", "\x00\x1f\u2028"]
FINISHES = [None, "stop", "length"]
CHAT_LOGPROBS = ChatLogprobs(
    content=[
        TokenLogprob(
            token="a",
            logprob=-0.5,
            bytes=[97],
            top_logprobs=[TopLogprob(token="a", logprob=-0.5, bytes=[97])],
        )
    ]
)
COMPLETION_LOGPROBS = CompletionLogprobs(
    tokens=["a"], token_logprobs=[-0.5], top_logprobs=[{"a": -0.5}], text_offset=[3]
)


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("finish", FINISHES)
@pytest.mark.parametrize("logprobs", [None, CHAT_LOGPROBS])
def test_a_chat_chunk_is_what_its_model_dumps(
    text: str, finish: str | None, logprobs: ChatLogprobs | None
) -> None:
    envelope = ChatCompletionChunk(id='chatcmpl-"x"', created=7, model="m/é", choices=[])
    choice = ChatChunkChoice(
        index=2,
        delta=ChatDelta(content=text),
        logprobs=logprobs,
        finish_reason=finish,  # type: ignore[arg-type]
    )
    expected = envelope.model_copy(update={"choices": [choice]}).model_dump_json()
    encoded = StreamChunks(envelope, chat_choice, n=3)(2, text, logprobs, finish)
    assert json.loads(encoded) == json.loads(expected)
    assert list(json.loads(encoded)) == list(json.loads(expected))


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("finish", FINISHES)
@pytest.mark.parametrize("logprobs", [None, COMPLETION_LOGPROBS])
def test_a_completion_chunk_is_what_its_model_dumps(
    text: str, finish: str | None, logprobs: CompletionLogprobs | None
) -> None:
    envelope = Completion(id="cmpl-1", created=7, model="m", choices=[])
    choice = CompletionChoice(
        index=0,
        text=text,
        logprobs=logprobs,
        finish_reason=finish,  # type: ignore[arg-type]
    )
    expected = envelope.model_copy(update={"choices": [choice]}).model_dump_json()
    encoded = StreamChunks(envelope, completion_choice, n=1)(0, text, logprobs, finish)
    assert json.loads(encoded) == json.loads(expected)


def test_an_envelope_needs_empty_choices() -> None:
    choice = CompletionChoice(index=0, text="", finish_reason=None)
    with pytest.raises(ValueError, match="choices"):
        StreamChunks(Completion(id="c", model="m", choices=[choice]), completion_choice, n=1)


def test_a_model_named_like_the_text_marker_is_still_encoded_right() -> None:
    envelope = Completion(id="c", model="\x00text\x00", choices=[])
    choice = CompletionChoice(index=0, text="\x00text\x00", finish_reason=None)
    expected = envelope.model_copy(update={"choices": [choice]}).model_dump_json()
    chunks = StreamChunks(envelope, completion_choice, n=1)
    assert json.loads(chunks(0, "\x00text\x00", None, None)) == json.loads(expected)


def test_a_chat_streams_opening_chunk_is_what_its_model_dumps() -> None:
    envelope = ChatCompletionChunk(id="chatcmpl-1", created=7, model="m/é", choices=[])
    choice = ChatChunkChoice(index=1, delta=ChatDelta(role="assistant", content=""))
    expected = envelope.model_copy(update={"choices": [choice]}).model_dump_json()
    assert StreamChunks(envelope, chat_choice, n=2).wrap(chat_opening_choice(1)) == expected


@pytest.mark.parametrize(
    ("envelope", "choice"),
    [
        (ChatCompletionChunk(id="chatcmpl-1", created=7, model="usage", choices=[]), chat_choice),
        (Completion(id="cmpl-1", created=7, model='"usage":null', choices=[]), completion_choice),
    ],
)
def test_a_streams_usage_chunk_is_what_its_model_dumps(envelope: Any, choice: Any) -> None:
    usage = Usage(prompt_tokens=3, completion_tokens=4, total_tokens=7)
    expected = envelope.model_copy(update={"usage": usage}).model_dump_json()
    assert StreamChunks(envelope, choice, n=1).usage(usage) == expected
    with_usage = envelope.model_copy(update={"usage": usage})
    with pytest.raises(ValueError, match="usage"):
        StreamChunks(with_usage, choice, n=1).usage(usage)
