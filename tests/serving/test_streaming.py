"""Streams over real HTTP as clients time them: the first event leaves only once the engine
has produced the first token (vLLM's server sends its opening role chunk then too), and the
chunk sequence stays what OpenAI's clients parse."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from tests.support.scripted_engine import ScriptedEngine, ScriptedRequest
from tests.support.serving import Served, ServeFactory


class FirstTokenHeld(ScriptedEngine):
    """Produces nothing until the test calls :meth:`release`: the prefill of a busy engine."""

    def __init__(self) -> None:
        super().__init__()
        self._gate = asyncio.Event()
        self.released_at: float | None = None

    def hold(self) -> None:
        self._gate.clear()
        self.released_at = None

    def release(self) -> None:
        self.released_at = time.monotonic()
        self._gate.set()

    async def _produce(self, request: ScriptedRequest) -> None:
        await self._gate.wait()
        await super()._produce(request)


async def timed_events(served: Served, path: str, body: dict[str, Any]) -> list[tuple[float, Any]]:
    """Each ``data:`` payload of the stream with when it arrived (monotonic)."""
    events: list[tuple[float, Any]] = []
    async with served.client() as client, client.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                events.append((time.monotonic(), data if data == "[DONE]" else json.loads(data)))
    return events


async def held_stream(
    served: Served, engine: FirstTokenHeld, path: str, body: dict[str, Any]
) -> list[tuple[float, Any]]:
    """The stream of a request whose first token the engine holds for a while after the
    request reached it."""
    engine.hold()
    before = len(engine.requests)
    reading = asyncio.create_task(timed_events(served, path, body))
    deadline = time.monotonic() + 10
    while len(engine.requests) == before:
        assert time.monotonic() < deadline and not reading.done()
        await asyncio.sleep(0.01)
    # Long enough for an event sent at admission to reach the client.
    await asyncio.sleep(0.3)
    engine.release()
    events = await asyncio.wait_for(reading, 10)
    assert engine.released_at is not None
    assert events[0][0] >= engine.released_at, "an event was sent before the first token"
    return events


async def test_a_chat_stream_opens_with_the_first_token(serve: ServeFactory) -> None:
    engine = FirstTokenHeld()
    async with serve(engine) as served:
        body = {
            "model": served.model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "n": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        events = await held_stream(served, engine, "/v1/chat/completions", body)
    payloads = [payload for _, payload in events]
    assert payloads[-1] == "[DONE]"
    *chunks, usage = payloads[:-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 8
    assert {c["id"] for c in payloads[:-1]} == {usage["id"]}
    assert all(c["object"] == "chat.completion.chunk" and c["usage"] is None for c in chunks)
    for index in (0, 1):
        deltas = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        opening, *content = deltas
        assert opening["delta"] == {"role": "assistant", "content": "", "tool_calls": None}
        assert opening["finish_reason"] is None
        assert all(d["delta"]["role"] is None for d in content)
        assert len("".join(d["delta"]["content"] for d in content)) == 4
        assert [d["finish_reason"] for d in content][-1] == "length"
        assert all(d["finish_reason"] is None for d in content[:-1])


async def test_a_completion_stream_opens_with_the_first_token(serve: ServeFactory) -> None:
    engine = FirstTokenHeld()
    async with serve(engine) as served:
        body = {"model": served.model, "prompt": "echo me", "max_tokens": 3, "stream": True}
        events = await held_stream(served, engine, "/v1/completions", body)
        echoed = await held_stream(served, engine, "/v1/completions", {**body, "echo": True})
    assert events[-1][1] == echoed[-1][1] == "[DONE]"
    text = "".join(c["choices"][0]["text"] for _, c in events[:-1])
    with_echo = "".join(c["choices"][0]["text"] for _, c in echoed[:-1])
    assert len(text) == 3 and with_echo == "echo me" + text
    assert [c["choices"][0]["finish_reason"] for _, c in events[:-1]][-1] == "length"
