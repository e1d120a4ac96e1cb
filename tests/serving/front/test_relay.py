"""A relayed chunk is what the model's way makes of it, byte for byte; what the relay does not
take is left to the model."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.protocol import ChatCompletionChunk, Completion
from app.serving.front.relay import ChunkKind, ChunkRelay, Counts
from app.serving.front.upstream_run import read_answer
from app.serving.sse import event

MODELS: dict[ChunkKind, type[ChatCompletionChunk] | type[Completion]] = {
    "chat": ChatCompletionChunk,
    "completion": Completion,
}


def chat_chunk(choice: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-upstream",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "helper@v2",
        "choices": [choice],
        "usage": {"prompt_tokens": 8, "completion_tokens": 3, "total_tokens": 11},
        **fields,
    }


def completion_chunk(choice: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {**chat_chunk(choice, **fields), "object": "text_completion"}


def by_the_model(kind: ChunkKind, data: bytes) -> str:
    """What the front made of a chunk before the relay: the model, with the gateway's id and
    the tenant's model, and no usage."""
    chunk = read_answer(MODELS[kind], data, {})
    chunk.usage = None
    chunk.id, chunk.model = "chatcmpl-ours", "helper"
    return event(chunk)


RELAYED: list[tuple[ChunkKind, dict[str, Any]]] = [
    ("chat", chat_chunk({"index": 0, "delta": {"content": "hi"}, "finish_reason": None})),
    ("chat", chat_chunk({"index": 0, "delta": {"content": 'a "quote"\n\\ é 漢 \x01 🙂'}})),
    ("chat", chat_chunk({"index": 1, "delta": {"content": ""}, "finish_reason": "length"})),
    # vLLM's own extra fields, which the model drops.
    (
        "chat",
        chat_chunk(
            {
                "index": 0,
                "delta": {"content": "x", "reasoning_content": None},
                "logprobs": None,
                "finish_reason": "stop",
                "stop_reason": None,
                "token_ids": None,
            },
            prompt_token_ids=None,
            system_fingerprint="fp",
        ),
    ),
    ("chat", {**chat_chunk({"index": 0, "delta": {"content": "x"}}), "usage": None}),
    ("completion", completion_chunk({"index": 0, "text": "hi", "finish_reason": None})),
    ("completion", completion_chunk({"index": 1, "text": "é", "finish_reason": "stop"})),
]


@pytest.mark.parametrize(("kind", "chunk"), RELAYED)
def test_a_relayed_chunk_is_what_the_model_makes_of_it(
    kind: ChunkKind, chunk: dict[str, Any]
) -> None:
    for data in (json.dumps(chunk).encode(), json.dumps(chunk, ensure_ascii=False).encode()):
        relayed = ChunkRelay(kind, "chatcmpl-ours", "helper", 2).read(data)
        if b"\\ud8" in data:  # an escaped surrogate pair: left to the model, as lone ones
            assert relayed is None
            continue
        assert relayed is not None
        assert relayed.event == by_the_model(kind, data)
        choice = chunk["choices"][0]
        assert [(c.index, c.finish_reason) for c in relayed.choices] == [
            (choice["index"], choice.get("finish_reason"))
        ]
        usage = chunk["usage"]
        expected = usage and Counts(usage["prompt_tokens"], usage["completion_tokens"])
        assert relayed.usage == expected


def test_one_relay_follows_its_streams_creation_time() -> None:
    relay = ChunkRelay("chat", "chatcmpl-ours", "helper", 1)
    for created in (5, 5, 6):
        data = json.dumps(
            {**chat_chunk({"index": 0, "delta": {"content": "x"}}), "created": created}
        )
        relayed = relay.read(data.encode())
        assert relayed is not None and relayed.event == by_the_model("chat", data.encode())


LEFT_TO_THE_MODEL: list[tuple[ChunkKind, Any]] = [
    ("chat", chat_chunk({"index": 0, "delta": {"role": "assistant", "content": ""}})),
    ("chat", chat_chunk({"index": 0, "delta": {"tool_calls": [{"index": 0}]}})),
    ("chat", chat_chunk({"index": 0, "delta": {"content": None}})),
    ("chat", chat_chunk({"index": 0, "delta": {"content": "x"}, "logprobs": {"content": []}})),
    ("chat", chat_chunk({"index": 0, "delta": {"content": "x"}, "finish_reason": "abort"})),
    ("chat", chat_chunk({"index": 2, "delta": {"content": "x"}})),  # beyond n
    ("chat", chat_chunk({"index": -1, "delta": {"content": "x"}})),
    ("chat", chat_chunk({"index": "0", "delta": {"content": "x"}})),  # the model coerces it
    ("chat", chat_chunk({"index": 0, "delta": {"content": "x"}}, created=1.0)),
    ("chat", chat_chunk({"index": 0, "delta": {"content": "x"}}, object="text_completion")),
    ("chat", {**chat_chunk({"index": 0, "delta": {"content": "x"}}), "choices": []}),  # usage
    ("chat", {**chat_chunk({"index": 0, "delta": {"content": "x"}}), "usage": {"total": 1}}),
    ("chat", chat_chunk({"index": 0, "delta": {"content": "\ud800"}})),  # a lone surrogate
    ("chat", {"error": {"message": "engine died", "code": 500}}),
    ("chat", [1, 2]),
    ("completion", completion_chunk({"index": 0, "text": None})),
    ("completion", chat_chunk({"index": 0, "text": "x"})),
]


@pytest.mark.parametrize(("kind", "chunk"), LEFT_TO_THE_MODEL)
def test_what_is_not_of_the_common_shape_is_left_to_the_model(kind: ChunkKind, chunk: Any) -> None:
    assert ChunkRelay(kind, "chatcmpl-ours", "helper", 2).read(json.dumps(chunk).encode()) is None


def test_what_is_not_json_is_left_to_the_model() -> None:
    assert ChunkRelay("chat", "chatcmpl-ours", "helper", 1).read(b"<html>") is None
