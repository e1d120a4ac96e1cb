"""The victim: a tenant of its own sending one-token chat requests one after another from
127.0.0.1, each on a new connection (as a client without a pool would: under a connection
flood, getting a connection at all is part of its latency), each followed by a ``/healthz``
probe, as a load balancer's would be."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from tools.abuse.payloads import chat_payload
from tools.abuse.wire import exchange, http_request, json_post


@dataclass(frozen=True)
class VictimRequest:
    seconds: float
    outcome: str
    healthz_seconds: float
    healthz_outcome: str

    @property
    def ok(self) -> bool:
        return self.outcome == "200"


async def victim_phase(
    port: int,
    key: str,
    model: str,
    *,
    count: int,
    spread_seconds: float,
    timeout: float,
    limit_seconds: float,
) -> list[VictimRequest]:
    """``count`` requests, started no sooner than ``spread_seconds`` / ``count`` apart (so
    that an attack phase lasts long enough for the attack's own rhythm, a deadline of the
    gateway's say); fewer if ``limit_seconds`` runs out first."""
    request = json_post(
        "/v1/chat/completions",
        chat_payload(model, "Hi.", max_tokens=1, temperature=0),
        port=port,
        key=key,
    )
    probe = http_request("GET", "/healthz", port=port)
    started = time.monotonic()
    done: list[VictimRequest] = []
    for number in range(count):
        due = started + number * spread_seconds / count
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        if time.monotonic() - started > limit_seconds:
            break
        reply = await exchange(request, port=port, timeout=timeout)
        health = await exchange(probe, port=port, timeout=timeout)
        done.append(VictimRequest(reply.seconds, reply.outcome, health.seconds, health.outcome))
    return done
