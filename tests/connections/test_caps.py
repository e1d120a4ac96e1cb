"""Connections are capped globally (with a reserve for the probes) and per source; a trusted
proxy's requests count against the client its X-Forwarded-For names."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack

from tests.connections.probe_server import Running, read_until_closed, serving, status_of

# Long enough that idle connections stay open for the whole test.
PATIENT = {"request_head_timeout_seconds": 30.0}


def get(path: str, *headers: str) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: x", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def hold_idle(stack: AsyncExitStack, running: Running, count: int, source: str) -> None:
    """Open ``count`` more connections that send nothing, kept until ``stack`` closes."""
    expected = running.server.guard.open + count if running.server.guard else 0
    for _ in range(count):
        _, writer = await running.connect(source=source)
        stack.callback(writer.close)
    await running.open_count_reaches(expected)


async def test_past_the_cap_only_the_probes_are_served_then_503_at_once() -> None:
    limits = {"max_connections": 4, "connection_probe_reserve": 2}
    async with serving(**PATIENT, **limits) as running, AsyncExitStack() as stack:
        await hold_idle(stack, running, 4, source="127.0.0.2")
        # In the reserve: a probe is answered, anything else refused; each closes.
        for path in ("/healthz", "/readyz"):
            response, closed = await running.exchange(get(path))
            assert status_of(response) == 200 and closed, path
        response, closed = await running.exchange(get("/client"))
        assert status_of(response) == 503 and closed
        assert b"retry-after: 1" in response.lower()
        assert json.loads(response.split(b"\r\n\r\n", 1)[1])["error"]["code"] == (
            "too_many_connections"
        )
        # Reserve taken too: refused before a byte is read.
        await running.open_count_reaches(4)
        await hold_idle(stack, running, 2, source="127.0.0.3")
        reader, writer = await running.connect()
        response, closed = await read_until_closed(reader)
        writer.close()
        assert status_of(response) == 503 and closed
    assert "/client" not in running.probe.paths


async def test_the_cap_frees_up_as_connections_close() -> None:
    async with serving(**PATIENT, max_connections=2, connection_probe_reserve=1) as running:
        async with AsyncExitStack() as stack:
            await hold_idle(stack, running, 3, source="127.0.0.2")
            response, _ = await running.exchange(get("/client"))
            assert status_of(response) == 503
        await running.open_count_reaches(0)
        response, _ = await running.exchange(get("/client", "Connection: close"))
        assert status_of(response) == 200


async def test_one_source_holds_at_most_its_cap_others_are_still_served() -> None:
    async with serving(**PATIENT, max_connections_per_source=3) as running:
        async with AsyncExitStack() as stack:
            await hold_idle(stack, running, 3, source="127.0.0.2")
            reader, writer = await running.connect(source="127.0.0.2")
            response, closed = await read_until_closed(reader)
            writer.close()
            assert status_of(response) == 429 and closed
            assert b"retry-after: 1" in response.lower()
            # Another source is served.
            response, _ = await running.exchange(get("/client", "Connection: close"))
            assert status_of(response) == 200
        await running.open_count_reaches(0)
        response, _ = await running.exchange(
            get("/client", "Connection: close"), source="127.0.0.2"
        )
        assert status_of(response) == 200


async def test_x_forwarded_for_from_an_untrusted_peer_is_ignored() -> None:
    async with serving(**PATIENT, max_connections_per_source=1) as running:
        async with AsyncExitStack() as stack:
            await hold_idle(stack, running, 1, source="127.0.0.2")
            response, _ = await running.exchange(
                get("/client", "X-Forwarded-For: 203.0.113.9"), source="127.0.0.2"
            )
        assert status_of(response) == 429
        response, _ = await running.exchange(
            get("/client", "X-Forwarded-For: 203.0.113.9", "Connection: close")
        )
        assert json.loads(response.split(b"\r\n\r\n", 1)[1]) == {"host": "127.0.0.1"}


async def test_a_trusted_proxys_requests_count_against_the_forwarded_client() -> None:
    settings = {"max_connections_per_source": 1, "trusted_proxies": "127.0.0.0/30"}
    async with serving(**PATIENT, **settings) as running, AsyncExitStack() as stack:
        # The proxy's own connections are not capped per source: three at once.
        await hold_idle(stack, running, 2, source="127.0.0.1")
        held_reader, held_writer = await running.connect()
        stack.callback(held_writer.close)
        # A chain: the client, then a proxy the trusted one is reached through (untrusted,
        # so it is where the trust ends: the client counted is 198.51.100.4).
        held_writer.write(get("/hold", "X-Forwarded-For: 203.0.113.7, 198.51.100.4"))
        # In the app, so counted against its client: waited for (a minute bounds a hang; a
        # second, as it was, could pass on a busy machine, and the next request go unrefused).
        async with asyncio.timeout(60):
            while "/hold" not in running.probe.paths:
                await asyncio.sleep(0.01)
        refused, closed = await running.exchange(get("/client", "X-Forwarded-For: 198.51.100.4"))
        assert status_of(refused) == 429 and closed
        other, _ = await running.exchange(
            get("/client", "X-Forwarded-For: 203.0.113.7", "Connection: close")
        )
        assert status_of(other) == 200
        # The app sees the forwarded client too.
        assert json.loads(other.split(b"\r\n\r\n", 1)[1]) == {"host": "203.0.113.7"}
        # Once the held request is answered, that client may send another.
        running.probe.held.set()
        assert status_of(await held_reader.readuntil(b"}")) == 200
        again, _ = await running.exchange(
            get("/client", "X-Forwarded-For: 198.51.100.4", "Connection: close")
        )
        assert status_of(again) == 200
