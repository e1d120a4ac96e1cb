"""The attacker: each kind of attack counts every outcome, and stops by itself (its bounds) or
when told, counting what it still had in flight."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tests.tools.abuse_servers import answering, read_head, reply, serving, silent
from tools.abuse.attacks import IN_FLIGHT_AT_STOP, WARM_UP, Attack, AttackPlan
from tools.abuse.run import under_attack
from tools.abuse.victim import VictimRequest
from tools.abuse.wire import http_request

LOCAL = ("127.0.0.1",)


def never() -> bool:
    return False


async def test_a_flood_counts_each_reply_and_stops_at_its_attempts() -> None:
    ready: list[bool] = []
    async with serving(answering(429)) as port:
        plan = AttackPlan(
            "flood",
            port,
            (http_request("GET", "/a", port=port), http_request("GET", "/b", port=port)),
            concurrency=3,
            sources=LOCAL,
            max_attempts=20,
            warm_up=(http_request("GET", "/", port=port),),
        )
        attack = Attack(plan, never, lambda: ready.append(True))
        tally = await attack.run()
    assert tally == {"429": 20, WARM_UP + "429": 1}
    assert attack.attempts == 20
    assert ready == [True]


async def test_a_flood_told_to_stop_counts_what_it_had_in_flight() -> None:
    stop = asyncio.Event()
    async with serving(silent) as port:
        plan = AttackPlan("flood", port, (http_request("GET", "/", port=port),), sources=LOCAL)
        attack = Attack(plan, stop.is_set, lambda: None)
        running = asyncio.create_task(attack.run())
        await asyncio.sleep(0.3)
        stop.set()
        tally = await asyncio.wait_for(running, 60)  # bounds a hang only
    assert tally == {IN_FLIGHT_AT_STOP: 4}


async def test_an_attack_ends_by_itself_at_its_deadline() -> None:
    async with serving(silent) as port:
        plan = AttackPlan(
            "flood",
            port,
            (http_request("GET", "/", port=port),),
            concurrency=2,
            sources=LOCAL,
            max_seconds=0.3,
        )
        # The server never answers and nothing stops it: only its deadline can end it, with
        # its two requests in flight (the wait bounds a hang only).
        tally = await asyncio.wait_for(Attack(plan, never, lambda: None).run(), 60)
    assert tally == {IN_FLIGHT_AT_STOP: 2}


async def test_a_trickle_drips_until_the_server_ends_the_connection() -> None:
    dripped: list[bytes] = []

    async def times_out_after_three_bytes(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        head = await reader.readexactly(len(b"GET /x?"))
        dripped.append(head + await reader.readexactly(3))
        writer.write(reply(408))

    async with serving(times_out_after_three_bytes) as port:
        plan = AttackPlan(
            "trickle",
            port,
            (b"GET /x?",),
            concurrency=2,
            sources=LOCAL,
            trickle_interval=0.01,
            max_attempts=4,
        )
        tally = await asyncio.wait_for(Attack(plan, never, lambda: None).run(), 10)
    assert tally == {"408": 4}
    assert dripped == [b"GET /x?aaa"] * 4


async def test_a_trickle_counts_a_silent_close() -> None:
    async def closes_after_the_head(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await reader.readexactly(3)

    async with serving(closes_after_the_head) as port:
        plan = AttackPlan(
            "trickle", port, (b"GET",), concurrency=1, sources=LOCAL, trickle_interval=0.01,
            max_attempts=2,
        )  # fmt: skip
        tally = await asyncio.wait_for(Attack(plan, never, lambda: None).run(), 10)
    assert tally == {"closed": 2}


def chunked_stream(*, ended: bool) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = b"5\r\ndata:\r\n" * 3
    return head + body + (b"0\r\n\r\n" if ended else b"")


async def test_a_slow_reader_tells_a_stream_written_out_from_one_dropped() -> None:
    async def streams(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_head(reader)
        writer.write(chunked_stream(ended=b"/whole" in request))
        await writer.drain()

    async with serving(streams) as port:
        for path, outcome in (
            ("/whole", "200, then read to its end"),
            ("/cut", "200, then dropped"),
        ):
            plan = AttackPlan(
                "slow-read",
                port,
                (http_request("POST", path, port=port),),
                concurrency=1,
                sources=LOCAL,
                hold_seconds=0.05,
                max_attempts=1,
            )
            tally = await asyncio.wait_for(Attack(plan, never, lambda: None).run(), 10)
            assert tally == {outcome: 1}


async def test_a_slow_reader_refused_counts_the_refusal() -> None:
    async with serving(answering(429)) as port:
        plan = AttackPlan(
            "slow-read", port, (http_request("POST", "/", port=port),), concurrency=1,
            sources=LOCAL, max_attempts=2,
        )  # fmt: skip
        tally = await asyncio.wait_for(Attack(plan, never, lambda: None).run(), 10)
    assert tally == {"429": 2}


@contextmanager
def server_in_a_thread() -> Iterator[tuple[int, list[int]]]:
    """A 429 server on a loop of its own, for an attacker in another process; its port, and
    the count of requests it has answered (one item)."""
    ports: list[int] = []
    answered = [0]
    loop = asyncio.new_event_loop()
    up = threading.Event()
    stop = asyncio.Event()
    refuse = answering(429)

    async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await refuse(reader, writer)
        answered[0] += 1

    async def main() -> None:
        async with serving(counted) as port:
            ports.append(port)
            up.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert up.wait(10)
    try:
        yield ports[0], answered
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)


def test_the_attacker_runs_in_a_process_of_its_own_until_told_to_stop() -> None:
    with server_in_a_thread() as (port, answered):
        plan = AttackPlan("flood", port, (http_request("GET", "/", port=port),), sources=LOCAL)
        told: list[float] = []

        def victim() -> list[VictimRequest]:
            # While the attacker floods, until one of its workers has sent a second request,
            # so has counted its first answer: more answers than workers. A process starting
            # on a busy machine may take seconds.
            deadline = time.monotonic() + 60  # bounds a hang only
            while answered[0] <= plan.concurrency:
                assert time.monotonic() < deadline, "the attacker never flooded"
                time.sleep(0.01)
            told.append(time.monotonic())  # the victim is done: the attacker is told to stop
            return []

        measured, tally = under_attack(plan, 0.0, victim)
    assert measured == []
    assert tally["outcomes"].get("429", 0) > 0
    assert tally["attempts"] >= tally["outcomes"]["429"]
    assert time.monotonic() - told[0] < 30  # it stopped when told, not at its own end


async def test_a_slow_reader_told_to_stop_still_says_what_became_of_its_stream() -> None:
    async def streams_then_waits(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await read_head(reader)
        writer.write(chunked_stream(ended=False))
        await writer.drain()
        while await reader.read(1 << 16):  # still streaming, as far as the client can tell
            pass

    stop = asyncio.Event()
    async with serving(streams_then_waits) as port:
        plan = AttackPlan(
            "slow-read", port, (http_request("POST", "/", port=port),), concurrency=2,
            sources=LOCAL, hold_seconds=60,
        )  # fmt: skip
        running = asyncio.create_task(Attack(plan, stop.is_set, lambda: None).run())
        await asyncio.sleep(0.3)
        stop.set()
        tally = await asyncio.wait_for(running, 10)
    assert tally == {"200, then still streaming": 2}
