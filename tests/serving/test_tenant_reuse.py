"""A tenant id used again over the admin API (``DELETE`` then ``POST`` of the same id) names a
new tenant: none of the old one's usage, quota state or cached prefixes is the new one's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from app.tenancy.tenants import Tenant
from tests.support.redis_server import redis_server
from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import TENANT, Served, ServeFactory, chat, quota_usage

QUOTA = {"requests_per_minute": 1, "token_budget": 100_000, "budget_period": "day"}


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield f"{url}?socket_timeout=10&socket_connect_timeout=10"


def current(served: Served) -> Tenant:
    tenant = served.gateway.registry.tenant(TENANT)
    assert tenant is not None
    return tenant


async def create_again(served: Served) -> None:
    """Delete the tenant, create one under its id, and serve with a key of the new one."""
    await served.admin("DELETE", f"/tenants/{TENANT}")
    body = {"id": TENANT, "name": "Another customer", "allow_base_model": True}
    await served.admin("POST", "/tenants", body)
    served.key = (await served.admin("POST", f"/tenants/{TENANT}/keys", {"name": "k"}))["key"]


async def post(served: Served, **fields: Any) -> int:
    async with served.client() as client:
        response = await client.post("/v1/chat/completions", json=chat(served, **fields))
    return response.status_code


async def requests_reported(served: Served) -> int:
    report = await served.admin("GET", f"/tenants/{TENANT}/usage")
    return int(sum(total["requests"] for total in report["data"]))


async def test_the_new_tenant_has_no_usage_and_another_cache_salt(serve: ServeFactory) -> None:
    engine = ScriptedEngine()
    async with serve(engine) as served:
        assert await post(served, max_tokens=3) == 200
        assert await requests_reported(served) == 1
        old = current(served)

        await create_again(served)
        new = current(served)
        assert new.uid != old.uid
        assert await requests_reported(served) == 0
        assert await post(served, max_tokens=3) == 200
        assert await requests_reported(served) == 1

        # Each request salted with its own tenant's random salt, never the id.
        salts = [request.cache_salt for request in engine.started()]
        assert salts == [old.cache_salt, new.cache_salt]
        assert old.cache_salt != new.cache_salt and TENANT not in salts
        # The old tenant's rows are kept, under its uid.
        assert [r.tenant_uid for r in await served.usage_records()] == [old.uid, new.uid]


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_the_new_tenant_starts_with_a_fresh_quota(
    serve: ServeFactory, backend: str, request: pytest.FixtureRequest
) -> None:
    redis = {"quota_url": request.getfixturevalue("redis_url")} if backend == "redis" else {}
    async with serve(ScriptedEngine(), **redis) as served:
        await served.set_quota(**QUOTA)
        assert await post(served, max_tokens=3) == 200
        await served.settled()
        assert await post(served, max_tokens=3) == 429  # its one request a minute
        assert (await quota_usage(served)).budget_used > 0

        await create_again(served)
        await served.set_quota(**QUOTA)
        level = await quota_usage(served)
        assert (level.budget_used, level.requests_per_minute_used) == (0, 0)
        assert await post(served, max_tokens=3) == 200
