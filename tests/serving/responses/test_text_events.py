"""The Responses events of a plain-text stream, made from the chat service's typed pieces,
are the events the chat stream's chunks make when read back: the same sequence, each event
the SDK's type, the text delta formatted as every other event is; no JSON is parsed."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from app.errors import GatewayError
from app.protocol.responses_api import ResponsesRequest
from app.serving.preparation.responses import Translated, translate
from app.serving.responses import events as events_module
from app.serving.responses.events import _Events, response_events, text_events
from app.serving.text_stream import TextEnd, TextPiece

STREAM_EVENT: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)
TEXTS = ["Hel", "lo, ", '"wörld"\n', "\u2603 \\ </script>"]


def translated() -> Translated:
    request = ResponsesRequest.model_validate({"model": "m", "input": "hi", "stream": True})
    return translate(request, [], response_id="resp_1")


def chat_stream(texts: list[str], finish: str, usage: tuple[int, int]) -> list[str]:
    """The chat service's events for ``texts``, as its stream writes them."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def chunk(delta: dict[str, Any], reason: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        return f"data: {json.dumps({**base, 'choices': [choice]})}\n\n"

    out = [chunk({"role": "assistant", "content": ""})]
    out += [
        chunk({"content": t}, finish if i == len(texts) - 1 else None) for i, t in enumerate(texts)
    ]
    counts = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    out.append(f"data: {json.dumps({**base, 'choices': [], 'usage': counts})}\n\ndata: [DONE]\n\n")
    return out


async def pieces(texts: list[str], finish: str, usage: tuple[int, int]) -> Any:
    for i, text in enumerate(texts):
        yield TextPiece(text, finish if i == len(texts) - 1 else None)
    yield TextEnd(*usage)


async def iterate(items: list[str]) -> AsyncIterator[str]:
    for item in items:
        yield item


def parsed(stream: list[str]) -> list[dict[str, Any]]:
    """The events of ``stream``, each checked against its SSE name and the SDK's type."""
    found = []
    for name, data in re.findall(r"event: (\S+)\ndata: (.*)\n\n", "".join(stream)):
        event = json.loads(data)
        assert event["type"] == name
        STREAM_EVENT.validate_python(event)
        found.append(event)
    return comparable(found)


def comparable(value: Any) -> Any:
    """``value`` with its random item ids and its times made comparable."""
    text = json.dumps(value)
    for n, item_id in enumerate(dict.fromkeys(re.findall(r'"(msg_[0-9a-f]+)"', text))):
        text = text.replace(item_id, f"msg_{n}")
    return json.loads(re.sub(r'"(created_at|completed_at)": \d+', r'"\1": 0', text))


async def both(texts: list[str], finish: str) -> tuple[list[str], list[str]]:
    kept: list[dict[str, Any]] = []

    async def keep(response: dict[str, Any]) -> None:
        kept.append(response)

    usage = (5, len(texts))
    from_text = [e async for e in text_events(translated(), pieces(texts, finish, usage), keep)]
    chat = iterate(chat_stream(texts, finish, usage))
    from_chat = [e async for e in response_events(translated(), chat, keep)]
    first, second = (comparable(one) for one in kept)
    assert first == second
    assert first["output"][0]["content"][0]["text"] == "".join(texts)
    return from_text, from_chat


@pytest.mark.parametrize("finish", ["stop", "length"])
async def test_the_text_path_makes_the_chat_paths_events(finish: str) -> None:
    from_text, from_chat = await both(TEXTS, finish)
    events = parsed(from_text)
    assert events == parsed(from_chat)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert deltas == TEXTS
    final = events[-1]
    assert final["type"] == ("response.completed" if finish == "stop" else "response.incomplete")
    assert final["response"]["usage"]["output_tokens"] == len(TEXTS)


async def test_an_output_with_no_text_is_one_empty_message_numbered_without_a_gap() -> None:
    from_text, from_chat = await both([""], "stop")
    events = parsed(from_text)
    assert events == parsed(from_chat)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert "response.output_text.delta" not in [e["type"] for e in events]
    assert events[-2]["item"]["content"][0]["text"] == ""


def test_a_text_delta_is_written_as_every_other_event() -> None:
    for text in TEXTS:
        fast, slow = _Events(translated()), _Events(translated())
        fast._text("")
        assert fast.message is not None
        slow.sequence = fast.sequence
        expected = slow.event(
            "response.output_text.delta",
            item_id=fast.message["id"],
            output_index=0,
            content_index=0,
            delta=text,
            logprobs=[],
        )
        assert fast.text_delta(text) == expected


def as_json_writes_them(stream: list[str]) -> None:
    """Every event of ``stream`` is byte for byte the JSON ``json.dumps`` writes of its data,
    whether it was encoded whole or written around its parts."""
    for name, data in re.findall(r"event: (\S+)\ndata: (.*)\n\n", "".join(stream)):
        assert data == json.dumps(json.loads(data)), name


@pytest.mark.parametrize("finish", ["stop", "length"])
async def test_every_event_is_the_json_its_data_encodes_to(finish: str) -> None:
    from_text, from_chat = await both([*TEXTS, "\x00\u2028\U0001f600 '\t"], finish)
    as_json_writes_them(from_text)
    as_json_writes_them(from_chat)
    failed = _Events(translated())
    as_json_writes_them([*failed.opening(), *failed._text("x"), failed.failed({"error": {}})])


BASE = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def chunk(delta: dict[str, Any] | None, reason: str | None = None, **extra: Any) -> str:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": reason}]
    return f"data: {json.dumps({**BASE, 'choices': choices, **extra})}\n\n"


def call(index: int, arguments: str, **first: str) -> dict[str, Any]:
    function = {"arguments": arguments, **({"name": first["name"]} if first else {})}
    head = {"id": first["id"], "type": "function"} if first else {}
    return {"tool_calls": [{"index": index, **head, "function": function}]}


async def test_text_then_calls_read_back_from_chat_chunks() -> None:
    stream = [
        chunk({"role": "assistant", "content": "Let me check."}),
        chunk(call(0, '{"city":', id="call_a", name="get_weather")),
        chunk(call(0, ' "Oslo"}')),
        chunk(call(1, "{}", id="call_b", name="get_time"), "tool_calls"),
        chunk(None, usage={"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}),
        "data: [DONE]\n\n",
    ]
    kept: list[dict[str, Any]] = []

    async def keep(response: dict[str, Any]) -> None:
        kept.append(response)

    out = [e async for e in response_events(translated(), iterate(stream), keep)]
    as_json_writes_them(out)
    events = parsed(out)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"].removeprefix("response.") for e in events] == [
        "created",
        "in_progress",
        "output_item.added",
        "content_part.added",
        "output_text.delta",
        "output_text.done",
        "content_part.done",
        "output_item.done",
        "output_item.added",
        "function_call_arguments.delta",
        "function_call_arguments.delta",
        "function_call_arguments.done",  # each call done before the next is added
        "output_item.done",
        "output_item.added",
        "function_call_arguments.delta",
        "function_call_arguments.done",
        "output_item.done",
        "completed",
    ]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [item.get("call_id") for item in done] == [None, "call_a", "call_b"]
    final = events[-1]["response"]
    assert final == comparable(kept[0])
    message, weather, clock = final["output"]
    assert message["content"][0]["text"] == "Let me check." and message["status"] == "completed"
    assert (weather["call_id"], weather["arguments"]) == ("call_a", '{"city": "Oslo"}')
    assert (clock["name"], clock["arguments"], clock["status"]) == ("get_time", "{}", "completed")
    assert final["usage"]["total_tokens"] == 12


async def test_the_text_path_parses_no_json(monkeypatch: pytest.MonkeyPatch) -> None:
    parses: list[str] = []
    loads = json.loads

    def counted(text: Any, **kwargs: Any) -> Any:
        parses.append(text)
        return loads(text, **kwargs)

    monkeypatch.setattr(events_module.json, "loads", counted)

    async def keep(response: dict[str, Any]) -> None:
        return None

    assert [e async for e in text_events(translated(), pieces(TEXTS, "stop", (1, 4)), keep)]
    assert parses == []
    chat = iterate(chat_stream(TEXTS, "stop", (1, 4)))
    assert [e async for e in response_events(translated(), chat, keep)]
    assert len(parses) == len(TEXTS) + 2  # the chat path: each chunk, the opening, the usage


async def test_a_failure_after_the_first_piece_ends_with_response_failed() -> None:
    async def failing() -> Any:
        yield TextPiece("Hel", None)
        raise GatewayError("the engine stopped")

    async def keep(response: dict[str, Any]) -> None:
        raise AssertionError("a failed response is not kept here")

    events = parsed([e async for e in text_events(translated(), failing(), keep)])
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["message"] == "the engine stopped"
    assert events[-1]["response"]["output"][0]["type"] == "message"

    async def failing_at_once() -> Any:
        raise GatewayError("refused")
        yield  # pragma: no cover

    with pytest.raises(GatewayError):
        [e async for e in text_events(translated(), failing_at_once(), keep)]


@pytest.mark.parametrize("path", ["text", "chat"])
async def test_a_response_that_cannot_be_kept_ends_its_stream_with_response_failed(
    path: str,
) -> None:
    """Its items done, numbered without a gap, then ``response.failed`` with the store's
    error: never ``response.completed`` for a Response a client could not then find."""

    async def storage_full(response: dict[str, Any]) -> None:
        raise GatewayError("The tenant's storage is full.")

    usage = (5, len(TEXTS))
    if path == "text":
        stream = text_events(translated(), pieces(TEXTS, "stop", usage), storage_full)
    else:
        stream = response_events(
            translated(), iterate(chat_stream(TEXTS, "stop", usage)), storage_full
        )
    events = parsed([e async for e in stream])
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[-4:]] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.failed",
    ]
    assert events[-1]["response"]["error"]["message"] == "The tenant's storage is full."
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "".join(TEXTS)


async def test_a_call_is_done_before_text_after_it_and_a_late_delta_fails_the_stream() -> None:
    async def keep(response: dict[str, Any]) -> None:
        return None

    usage = chunk(None, usage={"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8})
    stream = [
        chunk(call(0, "{}", id="call_a", name="get_time")),
        chunk({"content": "Done."}, "stop"),
        usage,
        "data: [DONE]\n\n",
    ]
    events = parsed([e async for e in response_events(translated(), iterate(stream), keep)])
    assert [e["type"].removeprefix("response.") for e in events][2:] == [
        "output_item.added",
        "function_call_arguments.delta",
        "function_call_arguments.done",
        "output_item.done",
        "output_item.added",
        "content_part.added",
        "output_text.delta",
        "output_text.done",
        "content_part.done",
        "output_item.done",
        "completed",
    ]
    late = [
        chunk(call(0, '{"a":', id="call_a", name="f")),
        chunk(call(1, "{}", id="call_b", name="g")),
        chunk(call(0, " 1}")),  # the first call's arguments, after the second began
        "data: [DONE]\n\n",
    ]
    events = parsed([e async for e in response_events(translated(), iterate(late), keep)])
    assert events[-1]["type"] == "response.failed"
    assert "after the next call had begun" in events[-1]["response"]["error"]["message"]
