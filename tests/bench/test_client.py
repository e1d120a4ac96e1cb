"""The closed-loop client against a tiny streaming server: at most ``concurrency``
requests at once, every request recorded, TTFT at the first content chunk (not the
role chunk), a cycling flood stopped by hanging up, refusals honoured."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from bench.client import Call, ClosedLoop, run_closed_loop
from bench.workload import PlannedRequest

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


def requests(count: int) -> list[PlannedRequest]:
    return [PlannedRequest(i, 0.0, i % 3, None, "hi", 2) for i in range(count)]


def call(_: PlannedRequest) -> Call:
    return Call("base", None)


async def test_closed_loop_holds_its_concurrency_and_records_every_request() -> None:
    async for server, url in serving(0.02):
        records, wall = await run_closed_loop(
            url, "s", "p", requests(9), call, concurrency=3, timeout_seconds=30
        )
        assert server.most_open == 3 and server.served == 9
        assert [r.index for r in records] == list(range(9))
        assert all(r.ok and r.output_tokens == 2 for r in records)
        # TTFT: the first token after one delay; the role chunk came at once.
        assert all(r.ttft is not None and r.ttft >= 0.02 for r in records)
        assert wall >= 3 * 0.04  # three waves of two tokens


async def test_a_cycling_loop_runs_until_stopped_and_hangs_up() -> None:
    async for server, url in serving(0.05):
        loop = ClosedLoop(url, "s", "flood", requests(2), call, concurrency=4, cycle=True)
        loop.start()
        await asyncio.sleep(0.5)
        await loop.stop()
        assert len(loop.records) > 4  # it kept going past the two planned requests
        assert any(r.error == ClosedLoop.CANCELLED for r in loop.records)
        await asyncio.sleep(0.1)
        assert server.open == 0


async def test_a_deadline_records_what_never_ran() -> None:
    async for _, url in serving(0.5):
        records, _ = await run_closed_loop(
            url, "s", "p", requests(3), call, concurrency=1, timeout_seconds=0.3
        )
        assert len(records) == 3 and not any(r.ok for r in records)
        assert records[0].error == "not finished before the deadline"
        assert records[2].error == "not sent before the deadline"


async def test_a_refused_client_waits_for_retry_after() -> None:
    async for server, url in serving(0.0, refuse=True):
        loop = ClosedLoop(url, "s", "flood", requests(2), call, concurrency=1, cycle=True)
        loop.start()
        await asyncio.sleep(0.5)
        await loop.stop()
        # Every 0.2 s, not as fast as the refusals come back.
        assert 2 <= server.served <= 4
        assert all(r.status == 429 and r.retry_after == 0.2 for r in loop.records)
