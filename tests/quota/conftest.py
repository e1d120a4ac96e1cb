"""The quota suite runs on every backend: in-process, and Redis on a throwaway ``redis-server``
started for the session (``apt-get install redis-server``).

``make_backend`` builds backends of the parametrised kind; in a Redis test all of them share
one fresh key prefix, so two of them are two replicas of one gateway. ``clock`` moves time on:
the in-process backend's injected clock, or a real sleep for Redis, whose clock is its own.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from app.quota.backend import QuotaBackend
from app.quota.memory import MemoryBackend
from app.quota.redis import RedisBackend
from tests.support.quota import Clock, FakeClock, MakeBackend, RealClock
from tests.support.redis_server import redis_server


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A ``redis-server`` on a free loopback port, for this test session only.

    Its URL carries generous socket timeouts: on a 2-core CI machine busy with an engine, fifty
    connections opened at once can take longer than the gateway's 1 s default, and these tests
    are about limits, not timeouts (the unreachable-store tests use a closed port)."""
    with redis_server() as url:
        yield f"{url}?socket_timeout=10&socket_connect_timeout=10"


@pytest.fixture(params=["memory", "redis"])
def backend_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
def clock(backend_kind: str) -> Clock:
    return FakeClock() if backend_kind == "memory" else RealClock()


@pytest.fixture
async def make_backend(
    backend_kind: str, clock: Clock, request: pytest.FixtureRequest
) -> AsyncIterator[MakeBackend]:
    created: list[QuotaBackend] = []
    prefix = f"t{uuid.uuid4().hex[:12]}:"
    url = request.getfixturevalue("redis_url") if backend_kind == "redis" else None

    def make(**options: Any) -> QuotaBackend:
        backend: QuotaBackend
        if url is None:
            assert isinstance(clock, FakeClock)
            backend = MemoryBackend(clock=clock, **options)
        else:
            backend = RedisBackend.from_url(url, key_prefix=prefix, **options)
        created.append(backend)
        return backend

    yield make
    for backend in created:
        await backend.close()


@pytest.fixture
def backend(make_backend: MakeBackend) -> QuotaBackend:
    return make_backend()
