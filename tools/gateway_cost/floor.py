"""What the server and the web framework cost a streamed request before any gateway code:
the floor under ``cost.*.request``.

``python -m tools.gateway_cost.floor`` serves two apps, each in a process of its own, with
uvicorn as the gateway runs it (httptools, its default event loop), and drives both with
:mod:`tools.gateway_cost`'s client, in turns, round by round:

* ``asgi``: a bare ASGI callable: the body read, the request's JSON parsed, the response's
  start and its events sent, one ``send`` each;
* ``fastapi``: the same as a FastAPI route with a pydantic body and a ``StreamingResponse``,
  the framework as it comes.

Each streams ``max_tokens`` chat chunks (the client's short phase: 1), the usage and
``[DONE]``. Printed: each app's CPU per request (user + system), median and spread over the
rounds. The gateway's figure at the same concurrency (``make gateway-cost``) less FastAPI's
is what the gateway's own code, its middleware and its lane add to the framework.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psutil
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from tools.gateway_cost.load import chat_request, run_phase
from tools.gateway_cost.ports import HOST, free_port, wait_for_port

CHUNK = (
    b'data: {"id":"chatcmpl-floor","object":"chat.completion.chunk","created":0,'
    b'"model":"m","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}\n\n'
)


def _end(tokens: int) -> bytes:
    usage = {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": 8 + tokens}
    return (
        b"data: %s\n\ndata: [DONE]\n\n"
        % json.dumps({"choices": [], "usage": usage}, separators=(",", ":")).encode()
    )


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    tokens = int(json.loads(body)["max_tokens"])
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    for _ in range(tokens):
        await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
    await send({"type": "http.response.body", "body": _end(tokens), "more_body": False})


class Body(BaseModel):
    model: str
    messages: list[dict[str, str]]
    max_tokens: int
    stream: bool = False
    stream_options: dict[str, bool] | None = None


def fastapi_app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(body: Body) -> StreamingResponse:
        async def events() -> AsyncIterator[bytes]:
            for _ in range(body.max_tokens):
                yield CHUNK
            yield _end(body.max_tokens)

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def serve(kind: str, port: int) -> None:
    import uvicorn

    app = asgi_app if kind == "asgi" else fastapi_app()
    uvicorn.run(app, host=HOST, port=port, http="httptools", log_level="warning")


@contextlib.contextmanager
def started(kind: str) -> Iterator[tuple[psutil.Process, int]]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "tools.gateway_cost.floor",
        f"--serve={kind}",
        f"--port={port}",
    ]
    process = subprocess.Popen(command)
    try:
        wait_for_port(process, port, 60, f"the {kind} app")
        yield psutil.Process(process.pid), port
    finally:
        process.terminate()
        process.wait(30)


def per_request_us(process: psutil.Process, port: int, streams: int, each: int) -> float:
    request = chat_request(HOST, port, "floor", "m", 1)
    before = sum(process.cpu_times()[:2])
    result = asyncio.run(run_phase(HOST, port, request, streams, each))
    time.sleep(0.5)
    return float(sum(process.cpu_times()[:2]) - before) / result.requests * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=512, help="requests per phase")
    parser.add_argument("--serve", choices=("asgi", "fastapi"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.port)
        return 0
    each = max(1, args.requests // args.streams)
    figures: dict[str, list[float]] = {"asgi": [], "fastapi": []}
    with started("asgi") as asgi, started("fastapi") as fastapi:
        apps = {"asgi": asgi, "fastapi": fastapi}
        for process, port in apps.values():  # warm-up
            per_request_us(process, port, args.streams, 1)
        for round_number in range(args.rounds):
            for kind in ("asgi", "fastapi") if round_number % 2 == 0 else ("fastapi", "asgi"):
                figures[kind].append(per_request_us(*apps[kind], args.streams, each))
    for kind, values in figures.items():
        print(
            f"{kind}: {statistics.median(values):.0f} us of CPU per request "
            f"({min(values):.0f}-{max(values):.0f}, median and min-max of {args.rounds} "
            f"rounds, {args.streams} streams)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
