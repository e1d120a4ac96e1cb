"""An OpenAI-shaped upstream for the front role's tests: a small real ASGI app served by
uvicorn on loopback (in a thread of its own, so a module's tests share it), which records
every request it gets and answers as its :class:`Script` says: JSON or SSE (vLLM's chunks,
with continuous usage when asked), an error status, or a hang.

    with fake_upstream() as upstream:
        upstream.script = Script(completion_tokens=5)
        ... the front forwards to upstream.url ...
        upstream.requests[-1].body["model"]
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.servers import PromptServer, free_port

# What the front may send upstream, and nothing else.
CHAT_BODY_KEYS = {
    "model", "messages", "n", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "min_tokens", "ignore_eos", "seed", "stop",
    "logit_bias", "response_format", "structured_outputs", "logprobs", "top_logprobs", "tools",
    "tool_choice", "parallel_tool_calls", "max_completion_tokens", "cache_salt", "stream",
    "stream_options", "stream_interval", "vllm_xargs",
}  # fmt: skip

UPSTREAM_PROMPT_TOKENS = 123
"""What the fake counts for any prompt: not what the front counts, so a test can tell which
count was charged."""


@dataclass
class Script:
    """How the next requests are answered."""

    completion_tokens: int = 4
    status: int = 200
    error: dict[str, Any] | None = None
    error_headers: dict[str, str] = field(default_factory=dict)
    step_seconds: float = 0.0
    hang: bool = False
    # A stream that ends (the connection closed) after this many tokens, with no [DONE].
    cut_after: int | None = None
    # A stream that stops after this many tokens, until the front leaves (an answer that is
    # not streamed never comes).
    hold_after: int | None = None
    # A stream's tokens for each choice, where they differ (else ``completion_tokens`` each).
    choice_tokens: tuple[int, ...] | None = None


@dataclass
class Recorded:
    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    # Set when the front closed the connection before the answer was complete.
    disconnected: threading.Event = field(default_factory=threading.Event)
    # Tokens streamed so far (per choice).
    streamed: int = 0


@dataclass
class FakeUpstream:
    url: str
    script: Script = field(default_factory=Script)
    requests: list[Recorded] = field(default_factory=list)

    def wait_for_requests(self, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.requests) < count:
            assert time.monotonic() < deadline, "the upstream got no request"
            time.sleep(0.01)


def _usage(completion: int) -> dict[str, int]:
    prompt = UPSTREAM_PROMPT_TOKENS
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _app(fake: FakeUpstream) -> Starlette:
    async def answer(request: Request) -> Response:
        body = await request.json()
        recorded = Recorded(request.url.path, body, dict(request.headers))
        fake.requests.append(recorded)
        script = fake.script
        if script.hang:
            await _until_disconnected(request, recorded)
            return Response(status_code=204)
        if script.status != 200:
            error = script.error or {"detail": "failed"}
            return JSONResponse(error, status_code=script.status, headers=script.error_headers)
        chat = request.url.path.endswith("/chat/completions")
        n = int(body.get("n", 1))
        if not body.get("stream"):
            if script.hold_after is not None:
                await _until_disconnected(request, recorded)
                return Response(status_code=204)
            if script.step_seconds:
                # Generating: a client that leaves meanwhile is noticed, as vLLM notices.
                waited = asyncio.create_task(_until_disconnected(request, recorded))
                await asyncio.sleep(script.step_seconds * script.completion_tokens)
                if waited.done():
                    return Response(status_code=204)
                waited.cancel()
            text = "x" * script.completion_tokens
            choices = [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "length",
                }
                if chat
                else {"index": i, "text": text, "finish_reason": "length"}
                for i in range(n)
            ]
            return JSONResponse(
                {
                    "id": "upstream-id",
                    "object": "chat.completion" if chat else "text_completion",
                    "created": 1,
                    "model": body["model"],
                    "choices": choices,
                    "usage": _usage(script.completion_tokens * n),
                    # vLLM's extras: the front passes none of them on.
                    "prompt_token_ids": [1, 2, 3],
                    "kv_transfer_params": {"secret": True},
                }
            )
        return StreamingResponse(
            _chunks(body, chat, n, script, recorded), media_type="text/event-stream"
        )

    return Starlette(
        routes=[
            Route("/v1/chat/completions", answer, methods=["POST"]),
            Route("/v1/completions", answer, methods=["POST"]),
            Route("/health", lambda _: Response(status_code=200)),
        ]
    )


async def _until_disconnected(request: Request, recorded: Recorded) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(0.01)
    recorded.disconnected.set()


async def _chunks(
    body: dict[str, Any], chat: bool, n: int, script: Script, recorded: Recorded
) -> AsyncIterator[str]:
    options = body.get("stream_options") or {}
    continuous = bool(options.get("include_usage") and options.get("continuous_usage_stats"))
    object_ = "chat.completion.chunk" if chat else "text_completion"

    def chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None) -> str:
        payload = {
            "id": "upstream-id",
            "object": object_,
            "created": 1,
            "model": body["model"],
            "choices": choices,
        }
        if usage is not None:
            payload["usage"] = usage
        return f"data: {json.dumps(payload)}\n\n"

    def choice(index: int, text: str, finish: str | None, role: bool = False) -> dict[str, Any]:
        if chat:
            delta: dict[str, Any] = (
                {"role": "assistant", "content": ""} if role else {"content": text}
            )
            return {"index": index, "delta": delta, "finish_reason": finish}
        return {"index": index, "text": text, "finish_reason": finish}

    try:
        if chat:
            for i in range(n):
                yield chunk([choice(i, "", None, role=True)], _usage(0) if continuous else None)
        lengths = script.choice_tokens or (script.completion_tokens,) * n
        for step in range(1, max(lengths) + 1):
            if script.step_seconds:
                await asyncio.sleep(script.step_seconds)
            if script.cut_after is not None and step > script.cut_after:
                return
            if script.hold_after is not None and step > script.hold_after:
                await asyncio.Event().wait()
            for i, length in enumerate(lengths):
                if step <= length:
                    finish = "length" if step == length else None
                    yield chunk([choice(i, "x", finish)], _usage(step) if continuous else None)
            recorded.streamed = step
        if options.get("include_usage"):
            yield chunk([], _usage(sum(lengths)))
        yield "data: [DONE]\n\n"
    except (asyncio.CancelledError, GeneratorExit):
        recorded.disconnected.set()
        raise


@contextmanager
def fake_upstream() -> Iterator[FakeUpstream]:
    """Serve a :class:`FakeUpstream` on a free loopback port until the block ends."""
    port = free_port()
    fake = FakeUpstream(url=f"http://127.0.0.1:{port}")
    server = PromptServer(
        uvicorn.Config(_app(fake), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, name="fake-upstream", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the fake upstream did not start"
        time.sleep(0.01)
    try:
        yield fake
    finally:
        server.should_exit = True
        thread.join(timeout=10)
