"""The client: streamed chat completions over keep-alive HTTP/1.1 on loopback, read with as
little work as an SSE client can do, either in an open loop (requests sent at given times,
whatever the answers do) or in a closed loop (streams that each send their next request when
the last one ended)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass

TERMINATOR = b"\r\n0\r\n\r\n"  # the last chunk of a chunked body
COMPLETION_TOKENS = re.compile(rb'"completion_tokens":\s*(\d+)')


@dataclass(frozen=True)
class Target:
    """Where requests go and what they say."""

    host: str
    port: int
    key: str
    model: str

    def request(self, max_tokens: int) -> bytes:
        body = json.dumps(
            {
                "model": self.model,
                "messages": [{"role": "user", "content": "Say something."}],
                "max_tokens": max_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode()
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Authorization: Bearer {self.key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body


def completion_tokens(response: bytes) -> int:
    """The completion tokens a streamed response's usage reports; refuses a response that
    is not a 200 ending in ``[DONE]`` with usage."""
    if not response.startswith(b"HTTP/1.1 200 "):
        raise RuntimeError(f"refused: {response[:300]!r}")
    usage = COMPLETION_TOKENS.findall(response)
    if b"data: [DONE]" not in response or not usage:
        raise RuntimeError(f"stream without usage or [DONE]: {response[-300:]!r}")
    return int(usage[-1])


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def exchange(self, request: bytes) -> int:
        """One request; the completion tokens of its answer."""
        self.writer.write(request)
        buffer = bytearray()
        while not buffer.endswith(TERMINATOR):
            data = await self.reader.read(1 << 16)
            if not data:
                raise ConnectionError(f"closed mid-response: {bytes(buffer[:300])!r}")
            buffer += data
            if len(buffer) < 4096 and buffer.startswith(b"HTTP/1.1 ") and buffer[9:12] != b"200":
                raise RuntimeError(f"refused: {bytes(buffer[:600])!r}")
        return completion_tokens(bytes(buffer))

    def close(self) -> None:
        self.writer.close()


async def connect(target: Target) -> Connection:
    return Connection(*await asyncio.open_connection(target.host, target.port))


@dataclass
class LoopResult:
    requests: int
    errors: int
    completion_tokens: int
    wall_seconds: float
    latencies: list[float]  # seconds, of the answered requests
    first_error: str = ""


async def open_loop(target: Target, arrivals: list[float], max_tokens: int) -> LoopResult:
    """Send a request at each arrival time (seconds from now) on an idle kept-alive
    connection, or a new one when none is idle. A request's latency runs from its arrival
    time, not from when it was sent, so a client that falls behind shows as latency."""
    request = target.request(max_tokens)
    idle: list[Connection] = []
    latencies: list[float] = []
    errors: list[str] = []
    tokens = 0
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one(arrival: float) -> None:
        nonlocal tokens
        connection = None
        try:
            if idle:
                connection = idle.pop()
                try:
                    tokens += await connection.exchange(request)
                except ConnectionError:
                    # The server closed a connection idle past its keep-alive timeout, as
                    # servers do: a client sends again on a new one.
                    connection.close()
                    connection = None
            if connection is None:
                connection = await connect(target)
                tokens += await connection.exchange(request)
            latencies.append(loop.time() - start - arrival)
            idle.append(connection)
        except (OSError, RuntimeError) as error:
            errors.append(str(error)[:300])
            if connection is not None:
                connection.close()

    tasks = []
    for arrival in arrivals:
        delay = start + arrival - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(arrival)))
    await asyncio.gather(*tasks)
    wall = loop.time() - start
    for connection in idle:
        connection.close()
    return LoopResult(
        len(arrivals), len(errors), tokens, wall, latencies, errors[0] if errors else ""
    )


async def closed_loop(target: Target, streams: int, each: int, max_tokens: int) -> LoopResult:
    """``streams`` connections, each sending ``each`` requests one after another."""
    request = target.request(max_tokens)
    latencies: list[float] = []
    errors: list[str] = []
    started = time.perf_counter()

    async def stream() -> int:
        connection = await connect(target)
        tokens = 0
        try:
            for _ in range(each):
                sent = time.perf_counter()
                try:
                    tokens += await connection.exchange(request)
                except (OSError, RuntimeError) as error:
                    errors.append(str(error)[:300])
                    connection.close()
                    connection = await connect(target)
                    continue
                latencies.append(time.perf_counter() - sent)
        finally:
            connection.close()
        return tokens

    tokens = sum(await asyncio.gather(*(stream() for _ in range(streams))))
    wall = time.perf_counter() - started
    return LoopResult(
        streams * each, len(errors), tokens, wall, latencies, errors[0] if errors else ""
    )
