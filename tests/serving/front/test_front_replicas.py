"""Two front replicas on one store and one Redis (a real ``redis-server``), in front of one
upstream: one limit for both, and a key revoked on one is refused by the other within a
second."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.fake_upstream import FakeUpstream, Script
from tests.support.front_app import Front, front_settings, running_front
from tests.support.redis_server import redis_server
from tests.support.store_polls import store_polls


@dataclass
class Replicas:
    fronts: list[Front]
    upstream: FakeUpstream

    @property
    def model(self) -> str:
        return self.fronts[0].gateway.registry.base_model_id

    async def tenant(self, tenant: str, **quota: Any) -> str:
        """A new tenant with ``quota``, made through the first replica; its key."""
        first = self.fronts[0]
        await first.admin(
            "POST", "/tenants", {"id": tenant, "name": tenant, "allow_base_model": True}
        )
        if quota:
            await first.admin("PUT", f"/tenants/{tenant}/quota", quota)
        key: str = (await first.admin("POST", f"/tenants/{tenant}/keys", {"name": "k"}))["key"]
        await self.seen_by_all(key)
        return key

    async def seen_by_all(self, key: str) -> None:
        deadline = time.monotonic() + 60  # bounds a hang only
        while not all(_knows(front, key) for front in self.fronts):
            assert time.monotonic() < deadline, "a replica never saw the key"
            await asyncio.sleep(0.05)

    async def fire(self, key: str, count: int, **fields: Any) -> list[int]:
        """``count`` requests at once, alternating between the replicas; their statuses."""
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            **fields,
        }

        async def one(front: Front) -> int:
            async with front.client(key) as client:
                return (await client.post("/v1/chat/completions", json=body)).status_code

        return list(await asyncio.gather(*(one(self.fronts[i % 2]) for i in range(count))))


def _knows(front: Front, key: str) -> bool:
    try:
        front.gateway.registry.authenticate(key)
    except Exception:
        return False
    return True


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield f"{url}?socket_timeout=10&socket_connect_timeout=10"


@pytest.fixture(scope="module")
async def replicas(
    upstream: FakeUpstream, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Replicas]:
    state = tmp_path_factory.mktemp("front-replicas")
    async with AsyncExitStack() as stack:
        fronts = []
        for _ in range(2):
            settings = front_settings(upstream.url, state, quota_url=redis_url)
            fronts.append(await stack.enter_async_context(running_front(settings)))
        yield Replicas(fronts, upstream)


async def test_a_request_rate_is_one_limit_across_replicas(replicas: Replicas) -> None:
    key = await replicas.tenant("rate", requests_per_minute=5)
    statuses = await replicas.fire(key, 12)
    assert sorted(statuses) == [200] * 5 + [429] * 7


async def test_concurrency_is_one_limit_across_replicas(replicas: Replicas) -> None:
    key = await replicas.tenant("concurrency", max_concurrent_requests=3)
    # Each admitted request holds its slot for about a second.
    replicas.upstream.script = Script(completion_tokens=20, step_seconds=0.05)
    try:
        statuses = await replicas.fire(key, 8, stream=True)
    finally:
        replicas.upstream.script = Script()
    assert sorted(statuses) == [200] * 3 + [429] * 5
    # The slots are back: the next three are admitted.
    assert await replicas.fire(key, 3) == [200, 200, 200]


async def test_a_key_revoked_on_one_replica_is_refused_by_the_other_by_its_next_poll(
    replicas: Replicas,
) -> None:
    key = await replicas.tenant("revoked")
    first, second = replicas.fronts
    async with second.client(key) as client:
        body = {
            "model": replicas.model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
        }
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
        [listed] = await first.admin("GET", "/tenants/revoked/keys")
        with store_polls(second.gateway) as polls:
            await first.admin("DELETE", f"/tenants/revoked/keys/{listed['id']}")
            polls.expect(lambda: not _knows(second, key))
            # By its next poll (the one under way may have read the store before the change).
            assert await polls.seen_async() <= 2
        status = (await client.post("/v1/chat/completions", json=body)).status_code
    assert status == 401
