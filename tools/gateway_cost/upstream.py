"""An OpenAI upstream that costs the front role next to nothing: streamed chat completions in
vLLM's chunks, paced as :class:`~tools.gateway_cost.engine.PacedEngine` paces its tokens
(each step gives every running stream one token; ``rate`` tokens per second in all), with
the usage in every chunk that the front asks for (``continuous_usage_stats``), in chunks of
``stream_interval`` tokens as vLLM's server sends them (its own, raised by a request's; the
first token and the last at once).

It is also the run's reference: a minimal SSE server (raw asyncio, one write per token),
measured with the same client as the gateway, the least a Python process can spend
streaming these tokens.

``python -m tools.gateway_cost.upstream --port P --rate R [--stream-interval N]`` serves
until SIGINT or SIGTERM, in a process of its own so that the front's process is measured
alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
from typing import Any

PROMPT_TOKENS = 8
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


class Steps:
    """The engine's steps: each one wakes every running stream, and they come so that the
    streams get ``rate`` tokens per second in all."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.running = 0
        self._step: asyncio.Future[None] | None = None

    async def next(self) -> None:
        if self._step is None:
            self._step = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_later(max(self.running, 1) / self.rate, self._done)
        await asyncio.shield(self._step)

    def _done(self) -> None:
        step, self._step = self._step, None
        if step is not None:
            step.set_result(None)


def _chunk(payload: dict[str, Any] | str) -> bytes:
    text = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    data = f"data: {text}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _usage(completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": completion,
        "total_tokens": PROMPT_TOKENS + completion,
    }


async def _answer(
    body: dict[str, Any], writer: asyncio.StreamWriter, steps: Steps, stream_interval: int
) -> None:
    options = body.get("stream_options") or {}
    continuous = bool(options.get("continuous_usage_stats"))

    def event(delta: dict[str, Any], finish: str | None, produced: int) -> bytes:
        payload: dict[str, Any] = {
            "id": "chatcmpl-upstream",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": body["model"],
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        if continuous:
            payload["usage"] = _usage(produced)
        return _chunk(payload)

    tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
    interval = max(stream_interval, int(body.get("stream_interval") or 1))
    writer.write(HEAD + event({"role": "assistant", "content": ""}, None, 0))
    steps.running += 1
    sent = 0
    try:
        for produced in range(1, tokens + 1):
            await steps.next()
            if produced == tokens or produced == 1 or produced - sent >= interval:
                finish = "length" if produced == tokens else None
                writer.write(event({"content": "x" * (produced - sent)}, finish, produced))
                sent = produced
                await writer.drain()
    finally:
        steps.running -= 1
    tail = b""
    if options.get("include_usage"):
        tail += _chunk({"id": "chatcmpl-upstream", "object": "chat.completion.chunk",
                        "created": 1, "model": body["model"], "choices": [],
                        "usage": _usage(tokens)})  # fmt: skip
    writer.write(tail + _chunk("[DONE]") + b"0\r\n\r\n")
    await writer.drain()


async def _connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, steps: Steps, stream_interval: int
) -> None:
    """Requests one after another on a kept-alive connection."""
    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = json.loads(await reader.readexactly(length)) if length else {}
            if not head.startswith(b"POST /v1/chat/completions "):
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                continue
            await _answer(body, writer, steps, stream_interval)
    writer.close()


async def serve_upstream(port: int, steps: Steps, stream_interval: int = 1) -> None:
    """Serve on loopback ``port`` until cancelled."""
    server = await asyncio.start_server(
        lambda r, w: _connection(r, w, steps, stream_interval), "127.0.0.1", port, backlog=4096
    )
    async with server:
        await server.serve_forever()


async def _until_signalled(port: int, rate: float, stream_interval: int) -> None:
    serving = asyncio.create_task(serve_upstream(port, Steps(rate), stream_interval))
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    await stop.wait()
    serving.cancel()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True, help="tokens/s over all streams")
    parser.add_argument("--stream-interval", type=int, default=1, help="tokens a chunk gathers")
    args = parser.parse_args(argv)
    asyncio.run(_until_signalled(args.port, args.rate, args.stream_interval))


if __name__ == "__main__":
    main()
