"""The client side: N streams at once over keep-alive HTTP/1.1 on loopback, each sending its
requests one after another, read with as little work as an SSE client can do (the client
shares the machine's cores with the gateway it measures)."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass

TERMINATOR = b"\r\n0\r\n\r\n"  # the last chunk of a chunked body


@dataclass(frozen=True)
class Reading:
    """How a stream of one endpoint is read: where its count of output tokens is, and what
    says it ended."""

    tokens: re.Pattern[bytes]
    ends: tuple[bytes, ...]


CHAT = Reading(re.compile(rb'"completion_tokens":(\d+)'), (b"data: [DONE]",))
RESPONSES = Reading(
    re.compile(rb'"output_tokens": ?(\d+)'),
    (b"event: response.completed\n", b"event: response.incomplete\n"),
)


@dataclass
class PhaseResult:
    requests: int
    completion_tokens: int
    events: int
    wall_seconds: float


CHAT_PATH = "/v1/chat/completions"
RESPONSES_PATH = "/v1/responses"


def chat_body(model: str, max_tokens: int) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def responses_body(model: str, max_tokens: int) -> dict[str, object]:
    """The chat request's Responses twin: the same prompt and budget, streamed, not stored
    (storing is a store write of its own, measured apart)."""
    return {
        "model": model,
        "input": "Say something.",
        "max_output_tokens": max_tokens,
        "stream": True,
        "store": False,
    }


def chat_request(host: str, port: int, key: str, model: str, max_tokens: int) -> bytes:
    return _post(host, port, key, CHAT_PATH, chat_body(model, max_tokens))


def responses_request(host: str, port: int, key: str, model: str, max_tokens: int) -> bytes:
    return _post(host, port, key, RESPONSES_PATH, responses_body(model, max_tokens))


def _post(host: str, port: int, key: str, path: str, payload: dict[str, object]) -> bytes:
    body = json.dumps(payload).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _stream_one(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes, reading: Reading
) -> tuple[int, int]:
    """One request on an open connection: (completion tokens, events)."""
    writer.write(request)
    buffer = bytearray()
    while not buffer.endswith(TERMINATOR):
        data = await reader.read(1 << 16)
        if not data:
            raise ConnectionError(f"connection closed mid-response: {bytes(buffer[:300])!r}")
        buffer += data
        if len(buffer) < 4096 and buffer.startswith(b"HTTP/1.1 ") and b" 200 " not in buffer[:16]:
            raise RuntimeError(f"refused: {bytes(buffer[:600])!r}")
    usage = reading.tokens.findall(buffer)
    if not any(end in buffer for end in reading.ends) or not usage:
        raise RuntimeError(f"stream without usage or its end: {bytes(buffer[-300:])!r}")
    return int(usage[-1]), buffer.count(b"data: ")


async def run_phase(
    host: str,
    port: int,
    request: bytes,
    streams: int,
    requests_per_stream: int,
    reading: Reading = CHAT,
) -> PhaseResult:
    """``streams`` connections, each sending ``requests_per_stream`` requests in turn."""
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def one_stream() -> tuple[int, int]:
        reader, writer = await asyncio.open_connection(host, port)
        tokens = events = 0
        try:
            for _ in range(requests_per_stream):
                got_tokens, got_events = await _stream_one(reader, writer, request, reading)
                tokens += got_tokens
                events += got_events
        finally:
            writer.close()
        return tokens, events

    results = await asyncio.gather(*(one_stream() for _ in range(streams)))
    return PhaseResult(
        requests=streams * requests_per_stream,
        completion_tokens=sum(tokens for tokens, _ in results),
        events=sum(events for _, events in results),
        wall_seconds=loop.time() - started,
    )
