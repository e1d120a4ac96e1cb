"""The abuse suite's hand-written HTTP: every way an exchange ends has its own outcome."""

from __future__ import annotations

import asyncio

import pytest

from tests.tools.abuse_servers import (
    answering,
    closing,
    read_head,
    reply,
    resetting,
    serving,
    silent,
)
from tools.abuse.wire import (
    CLOSED,
    CONNECT_FAILED,
    RESET,
    TIMEOUT,
    exchange,
    http_request,
    json_post,
    status_of,
)


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"HTTP/1.1 429 Too Many Requests\r\n", "429"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}", "200"),
        (b"HTTP/1.1 20", None),  # not all there yet
        (b"HTTP/1.1 200", None),
        (b"", None),
        (b"SSH-2.0-OpenSSH\r\n", None),
    ],
)
def test_the_status_is_read_from_a_whole_status_line_only(head: bytes, status: str | None) -> None:
    assert status_of(head) == status


def test_a_request_declares_the_whole_length_of_a_body_it_will_trickle() -> None:
    request = http_request("POST", "/v1/x", port=1, body=b"{", declared_length=100)
    head, body = request.split(b"\r\n\r\n")
    assert b"Content-Length: 100" in head.split(b"\r\n")
    assert b"Connection: close" in head.split(b"\r\n")
    assert body == b"{"
    posted = json_post("/v1/x", {"a": 1}, port=1, key="k")
    assert b"Authorization: Bearer k" in posted
    assert posted.endswith(b'{"a": 1}') and b"Content-Length: 8" in posted


async def test_a_reply_is_its_status() -> None:
    async with serving(answering(429)) as port:
        result = await exchange(json_post("/", {}, port=port, key=None), port=port, timeout=60)
    assert result.outcome == "429" and not result.ok


async def test_an_answer_given_before_a_large_body_is_sent_is_still_read() -> None:
    # The server answers 413 after the head and closes while 4 MiB are still on their way.
    async with serving(answering(413)) as port:
        request = json_post("/", b"x" * (4 << 20), port=port, key=None)
        result = await exchange(request, port=port, timeout=10)
    assert result.outcome == "413"


@pytest.mark.parametrize(
    ("handler", "outcome"), [(closing, CLOSED), (resetting, RESET), (silent, TIMEOUT)]
)
async def test_a_connection_that_ends_without_a_reply_says_how(
    handler: object, outcome: str
) -> None:
    async with serving(handler) as port:  # type: ignore[arg-type]
        # Short where the timeout is the outcome; else it bounds a hang only.
        timeout = 0.5 if outcome == TIMEOUT else 60
        result = await exchange(http_request("GET", "/", port=port), port=port, timeout=timeout)
    assert result.outcome == outcome


async def test_a_port_nobody_listens_on_fails_to_connect() -> None:
    async with serving(closing) as port:
        pass
    result = await exchange(http_request("GET", "/", port=port), port=port, timeout=60)
    assert result.outcome == CONNECT_FAILED


async def test_the_attackers_connect_from_their_own_address() -> None:
    peers: list[str] = []

    async def note_peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer.get_extra_info("peername")[0])
        await read_head(reader)
        writer.write(reply(200))

    async with serving(note_peer) as port:
        request = http_request("GET", "/", port=port)
        assert (await exchange(request, port=port, timeout=60, source="127.0.0.2")).ok
        assert (await exchange(request, port=port, timeout=60)).ok
    assert peers == ["127.0.0.2", "127.0.0.1"]
