"""Reservations whose Redis reply was lost, over a real network path that adds latency (a
proxy on loopback in front of the suite's ``redis-server``): the script ran, but the client
left while its reply was in flight, or gave up on it (a 503). Either way nothing stays charged,
and a reservation that reaches Redis only after its client gave up charges nothing either."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis

from app.quota import Limits, QuotaBackendUnavailable
from app.quota.redis import RedisBackend
from tests.quota.latency_proxy import LatencyProxy
from tests.support.own_metrics import OwnMetrics
from tests.support.quota import KEY, TENANT

TENANT_LIMITS = Limits(
    requests_per_minute=100,
    tokens_per_minute=10_000,
    max_concurrent=5,
    token_budget=1_000_000,
    budget_period="month",
)
KEY_LIMITS = Limits(requests_per_minute=10, max_concurrent=1)
SUBJECTS = [(TENANT, TENANT_LIMITS), (KEY, KEY_LIMITS)]
WORST_CASE = 5005


# Counted in metrics of this module's own: the process's move to a new storage whenever a
# gateway of another test starts or stops (tests/support/own_metrics.py).
QUOTA_ERRORS = OwnMetrics("QUOTA_BACKEND_ERRORS")


@pytest.fixture(autouse=True)
def quota_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    QUOTA_ERRORS.install(monkeypatch)


def void_failures() -> float:
    return sum(
        sample.value
        for family in QUOTA_ERRORS.registry.collect()
        for sample in family.samples
        if sample.name == "lora_gateway_quota_backend_errors_total"
        and sample.labels.get("operation") == "void"
    )


@pytest.fixture
async def proxy(redis_url: str) -> AsyncIterator[LatencyProxy]:
    port = urlsplit(redis_url).port
    assert port is not None
    proxy = LatencyProxy(port)
    yield proxy
    await proxy.close()


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:12]}:"


@pytest.fixture
async def direct(redis_url: str, prefix: str) -> AsyncIterator[RedisBackend]:
    """A replica that reaches Redis without the proxy, to read what was charged."""
    backend = RedisBackend.from_url(redis_url, key_prefix=prefix)
    yield backend
    await backend.close()


async def through(proxy: LatencyProxy, prefix: str, socket_timeout: float) -> RedisBackend:
    """A backend behind the proxy, connected (and its scripts loaded) before any latency."""
    port = await proxy.start()
    url = f"redis://127.0.0.1:{port}/0?socket_timeout={socket_timeout}&socket_connect_timeout=10"
    backend = RedisBackend.from_url(url, key_prefix=prefix)
    await backend.usage("warm-up", Limits(requests_per_minute=1))
    warm_up = [("warm-up", Limits(max_concurrent=1))]
    held = await backend.reserve(warm_up, 1)
    await backend.reconcile(held, 1)
    await backend._void("warm-up", "no attempt", 1, warm_up)  # the voids' own connection
    return backend


async def assert_nothing_charged(direct: RedisBackend) -> None:
    tenant = await direct.usage(TENANT, TENANT_LIMITS)
    assert tenant.requests == pytest.approx(0, abs=0.05)
    assert tenant.tokens == pytest.approx(0, abs=1)
    assert (tenant.concurrent, tenant.budget_used) == (0, 0)
    key = await direct.usage(KEY, KEY_LIMITS)
    assert key.requests == pytest.approx(0, abs=0.05)
    assert key.concurrent == 0


async def test_a_client_that_leaves_while_the_reply_is_in_flight_is_charged_nothing(
    proxy: LatencyProxy, prefix: str, direct: RedisBackend, redis_url: str
) -> None:
    backend = await through(proxy, prefix, socket_timeout=10)
    proxy.reply_delay = 3.0
    admin = Redis.from_url(redis_url, decode_responses=True)
    lost = asyncio.create_task(backend.reserve(SUBJECTS, WORST_CASE, reservation_id="r-left"))
    async with asyncio.timeout(5):  # until the script has run: its record is in Redis
        while not await admin.exists(f"{prefix}rs:r-left"):
            await asyncio.sleep(0.01)
    assert (await direct.usage(TENANT, TENANT_LIMITS)).budget_used == WORST_CASE
    lost.cancel()  # the client left
    with pytest.raises(asyncio.CancelledError):
        await lost
    proxy.reply_delay = 0.0  # for the void's reply (the reservation's is still held)
    await backend.close()  # a shutdown, too, lets the voids in flight finish
    await assert_nothing_charged(direct)
    assert await admin.zcard(f"{prefix}cc:{TENANT}") == 0  # released, not merely expired
    # No open reservation is left (what the soak test probes), only the void mark.
    assert not await admin.exists(f"{prefix}rs:r-left")
    assert await admin.exists(f"{prefix}vd:r-left")
    await admin.aclose()


async def test_a_reply_slower_than_the_socket_timeout_is_a_503_that_charges_nothing(
    proxy: LatencyProxy, prefix: str, direct: RedisBackend, caplog: pytest.LogCaptureFixture
) -> None:
    backend = await through(proxy, prefix, socket_timeout=0.3)
    proxy.reply_delay = 1.0
    failures = void_failures()
    with caplog.at_level(logging.WARNING, logger="app.quota"):
        for _ in range(2):
            with pytest.raises(QuotaBackendUnavailable) as refused:
                await backend.reserve(SUBJECTS, WORST_CASE)
            assert refused.value.reason == "timeout"
            await backend.drain()
    await assert_nothing_charged(direct)
    # The voids wait longer than requests do, so they went through; and their success does
    # not read as the store being back: one outage, logged once.
    assert void_failures() == failures
    # The quota's own records: caplog takes every logger's, a gateway served on a thread
    # of this worker included (the fuzz suite's).
    ours = [r for r in caplog.records if r.name.startswith("app.quota")]
    assert [r.getMessage()[:20] for r in ours] == ["quota store failing "]
    await backend.close()


async def test_a_reservation_reaching_redis_after_its_void_charges_nothing(
    proxy: LatencyProxy, prefix: str, direct: RedisBackend
) -> None:
    backend = await through(proxy, prefix, socket_timeout=0.3)
    proxy.request_delay = 1.0  # the reservation will reach Redis only after its client gave up
    with pytest.raises(QuotaBackendUnavailable):
        await backend.reserve(SUBJECTS, WORST_CASE)
    proxy.request_delay = 0.0  # the void overtakes it, on its own connection
    await backend.drain()
    await proxy.settled()  # the reservation has reached Redis now
    await asyncio.sleep(0.1)
    await assert_nothing_charged(direct)
    await backend.close()
