"""Every failure of the Redis store goes through the one fail-open/fail-closed policy and is
counted: not only an unreachable server, but a read-only replica after a failover, a server out
of memory, a timeout, an error reply, a reply the scripts never give. Settling and renewing never
raise into a request, and a renewal that failed works again once the store is back.

These tests break their own ``redis-server`` (the suite's shared one stays healthy)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from app.quota import Limits, QuotaBackendUnavailable, QuotaExceeded
from app.quota.outage import OutageLog
from app.quota.redis import RedisBackend
from tests.support.own_metrics import OwnMetrics
from tests.support.quota import KEY, TENANT
from tests.support.redis_server import redis_server
from tests.support.servers import free_port

LIMITS = Limits(requests_per_minute=100, tokens_per_minute=10_000, max_concurrent=5)
SUBJECTS = [(TENANT, LIMITS), (KEY, Limits(requests_per_minute=10))]


# Counted in metrics of this module's own: the process's move to a new storage whenever a
# gateway of another test starts or stops (tests/support/own_metrics.py).
QUOTA_ERRORS = OwnMetrics("QUOTA_BACKEND_ERRORS")


@pytest.fixture(autouse=True)
def quota_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    QUOTA_ERRORS.install(monkeypatch)


def errors(operation: str, reason: str) -> float:
    return QUOTA_ERRORS.value(
        "lora_gateway_quota_backend_errors_total", operation=operation, reason=reason
    )


@pytest.fixture(scope="module")
def breakable_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


@pytest.fixture
async def admin(breakable_url: str) -> AsyncIterator[Redis]:
    """A client to break the server with; it is mended after each test."""
    client = Redis.from_url(breakable_url, decode_responses=True)
    yield client
    await client.execute_command("REPLICAOF", "NO", "ONE")
    await client.config_set("maxmemory", 0)
    await client.aclose()


@pytest.fixture
async def make(breakable_url: str) -> AsyncIterator[Any]:
    created: list[RedisBackend] = []
    prefix = f"t{uuid.uuid4().hex[:12]}:"

    def make(**options: Any) -> RedisBackend:
        backend = RedisBackend.from_url(breakable_url, key_prefix=prefix, **options)
        created.append(backend)
        return backend

    yield make
    for backend in created:
        await backend.close()


async def make_read_only(admin: Redis) -> None:
    # What a primary demoted in a failover looks like to its old clients.
    await admin.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))


async def make_out_of_memory(admin: Redis) -> None:
    await admin.config_set("maxmemory-policy", "noeviction")
    await admin.config_set("maxmemory", 1)


BREAKERS = {"read_only": make_read_only, "out_of_memory": make_out_of_memory}


@pytest.mark.parametrize("reason", list(BREAKERS))
async def test_a_failing_store_fails_closed_by_default(
    make: Any, admin: Redis, reason: str
) -> None:
    backend = make()
    held = await backend.reserve(SUBJECTS, 10)
    await BREAKERS[reason](admin)
    before = errors("reserve", reason)
    with pytest.raises(QuotaBackendUnavailable) as refused:
        await backend.reserve(SUBJECTS, 10)
    assert refused.value.status_code == 503
    assert refused.value.body()["error"]["code"] == "quota_backend_unavailable"
    assert reason not in refused.value.message  # the cause stays in the log and the metric
    assert errors("reserve", reason) == before + 1
    # Voiding the refused reservation (its reply could have been lost) failed too: counted.
    await backend.drain()
    assert errors("void", reason) >= 1
    # Settling, renewing and charging a refusal report, count, and never raise into the request.
    assert await backend.renew(held) is False
    await backend.reconcile(held, 5)
    assert errors("renew", reason) >= 1
    before = errors("charge_refused", reason)
    await backend.charge_refused(SUBJECTS)
    assert errors("charge_refused", reason) == before + 1
    if reason == "read_only":
        # A full server still runs it: its first write (ZREM) frees memory, and Redis lets a
        # script that has written finish.
        assert errors("reconcile", reason) >= 1


@pytest.mark.parametrize("reason", list(BREAKERS))
async def test_a_failing_store_fails_open_when_told_to(
    make: Any, admin: Redis, reason: str
) -> None:
    backend = make(fail_open=True)
    await BREAKERS[reason](admin)
    admitted = await backend.reserve(SUBJECTS, 10)
    assert admitted.unchecked
    await backend.precheck(SUBJECTS)
    await backend.reconcile(admitted, 10)


async def test_precheck_reads_only_so_a_read_only_replica_still_answers_it(
    make: Any, admin: Redis
) -> None:
    backend = make()
    subjects = [(KEY, Limits(requests_per_minute=10))]
    for _ in range(10):
        await backend.reserve(subjects, 1)
    await make_read_only(admin)
    with pytest.raises(QuotaExceeded) as refused:  # not a 503
        await backend.precheck(subjects)
    assert (refused.value.limit, refused.value.subject) == ("requests", KEY)


async def test_a_failed_renewal_works_again_once_the_store_is_back(make: Any, admin: Redis) -> None:
    backend = make(lease_seconds=30)
    held = await backend.reserve(SUBJECTS, 10)
    await make_read_only(admin)
    assert await backend.renew(held) is False
    assert await backend.renew(held) is False
    await admin.execute_command("REPLICAOF", "NO", "ONE")
    assert await backend.renew(held) is True
    usage = await backend.usage(TENANT, LIMITS)
    assert usage.concurrent == 1


async def test_a_timeout_is_a_failure_too(make: Any, admin: Redis) -> None:
    backend = make(socket_timeout=0.2)
    await backend.reserve(SUBJECTS, 10)  # connected and scripts loaded
    before = errors("reserve", "timeout")
    await admin.execute_command("CLIENT", "PAUSE", "1000", "ALL")
    with pytest.raises(QuotaBackendUnavailable):
        await backend.reserve(SUBJECTS, 10)
    assert errors("reserve", "timeout") == before + 1


class ScriptedClient:
    """A Redis client whose every script gives ``reply`` (raised when an exception)."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply

    def register_script(self, _source: str) -> Any:
        async def run(**_: Any) -> Any:
            if isinstance(self.reply, BaseException):
                raise self.reply
            return self.reply

        return run

    async def aclose(self) -> None:
        pass


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ("not json", "unexpected_reply"),
        ("[1, 2]", "unexpected_reply"),
        ('{"levels": 5}', "unexpected_reply"),
        ('{"ok": true, "levels": [[1, null]]}', "unexpected_reply"),
        (ResponseError("ERR Error running script: attempt to compare nil"), "error_reply"),
        (ResponseError("READONLY You can't write against a read only replica."), "read_only"),
        (ResponseError("OOM command not allowed when used memory > 'maxmemory'."), "out_of_memory"),
    ],
)
async def test_any_failure_of_a_reply_follows_the_policy(reply: Any, reason: str) -> None:
    closed = RedisBackend(ScriptedClient(reply))  # type: ignore[arg-type]
    before = errors("reserve", reason)
    with pytest.raises(QuotaBackendUnavailable) as refused:
        await closed.reserve(SUBJECTS, 10)
    assert refused.value.reason == reason
    assert errors("reserve", reason) == before + 1
    with pytest.raises(QuotaBackendUnavailable):
        await closed.precheck(SUBJECTS)
    with pytest.raises(QuotaBackendUnavailable):
        await closed.usage(TENANT, LIMITS)
    await closed.charge_refused(SUBJECTS)  # never raises into the request
    await closed.drain()
    opened = RedisBackend(ScriptedClient(reply), fail_open=True)  # type: ignore[arg-type]
    assert (await opened.reserve(SUBJECTS, 10)).unchecked
    await opened.precheck(SUBJECTS)
    await opened.charge_refused(SUBJECTS)
    await opened.drain()


def test_an_outage_is_logged_when_it_starts_now_and_then_and_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    outage = OutageLog(fail_open=False, clock=lambda: now[0])
    cause = ConnectionError("refused")
    with caplog.at_level(logging.WARNING, logger="app.quota"):
        for _ in range(500):
            outage.failed("reserve", "unreachable", cause)
            now[0] += 0.1  # 50 s
        outage.failed("renew", "unreachable", cause)
        now[0] += 11
        outage.failed("reserve", "unreachable", cause)  # 61 s in: a summary
        outage.succeeded()
        outage.succeeded()
    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert len(messages) == 3, messages
    assert messages[0][0] == logging.ERROR and "refusing requests" in messages[0][1]
    assert "still failing" in messages[1][1]
    assert "reserve/unreachable x500" in messages[1][1]
    assert "renew/unreachable x1" in messages[1][1]
    assert messages[2][0] == logging.WARNING and "answering again" in messages[2][1]
    assert not outage.down
