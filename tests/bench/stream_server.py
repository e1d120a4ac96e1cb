"""A tiny HTTP/1.1 server that streams chat-completion chunks the way vLLM's server
does, for the benchmark client's tests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

ROLE = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
TOKEN = {"choices": [{"index": 0, "delta": {"content": "x"}}]}
USAGE = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}


class Server:
    """An HTTP/1.1 server streaming a role chunk at once, then two tokens after
    ``delay`` each; it counts the streams open at once."""

    def __init__(self, delay: float, refuse: bool = False) -> None:
        self.delay = delay
        self.refuse = refuse
        self.open = 0
        self.most_open = 0
        self.served = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                await reader.readexactly(length)
                if self.refuse:
                    self.served += 1
                    writer.write(
                        b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 0.2\r\n"
                        b"content-length: 2\r\n\r\n{}"
                    )
                    await writer.drain()
                    continue
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )

                def chunk(event: object) -> bytes:
                    data = f"data: {json.dumps(event) if event != '[DONE]' else event}\n\n"
                    return f"{len(data):x}\r\n{data}\r\n".encode()

                writer.write(chunk(ROLE))
                await writer.drain()
                for _ in range(2):
                    await asyncio.sleep(self.delay)
                    writer.write(chunk(TOKEN))
                    await writer.drain()
                writer.write(chunk(USAGE) + chunk("[DONE]") + b"0\r\n\r\n")
                await writer.drain()
                self.served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()


async def serving(delay: float, refuse: bool = False) -> AsyncIterator[tuple[Server, str]]:
    server = Server(delay, refuse)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        listener.close()
