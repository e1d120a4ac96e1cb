"""Two gateways sharing one store and one Redis enforce one limit: the replicas of a
scaled-out deployment. Each is an app of its own (its registry, quota client, scheduler) on
the session's engine; what they share is only what replicas share."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.settings import Settings
from tests.support.harness import admin_client_options
from tests.support.live_gateway import (
    LiveGateway,
    borrowed_settings,
    borrowing_gateway,
    long_stream,
)
from tests.support.redis_server import redis_server

pytestmark = pytest.mark.slow

LONG_STREAM = long_stream(Settings(_env_file=None).base_model_id)  # type: ignore[call-arg]
SHORT = {**LONG_STREAM, "stream": False, "max_tokens": 2}


@pytest.fixture(scope="module")
def replicas(gateway: LiveGateway, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Base URLs of two gateways on one SQLite store and one Redis quota store."""
    state: Path = tmp_path_factory.mktemp("replicas")
    with redis_server() as redis_url, ExitStack() as stack:
        urls = []
        for _ in range(2):
            settings = borrowed_settings(gateway, state, quota_url=redis_url)
            urls.append(stack.enter_context(borrowing_gateway(gateway, settings)).base_url)
        # One request through each replica first: the quota store's scripts are loaded
        # before a test counts statuses.
        headers = metered_key(urls, "warm-up", requests_per_minute=1000)
        assert asyncio.run(fire(urls, headers, 2, SHORT)) == [200, 200]
        yield urls


def metered_key(replicas: list[str], tenant: str, **quota: int) -> dict[str, str]:
    """A new tenant with ``quota``, created through the first replica; its key's header,
    once the second replica knows the key too."""
    with httpx.Client(**admin_client_options(replicas[0])) as admin:
        body = {"id": tenant, "name": tenant, "allow_base_model": True}
        assert admin.post("/tenants", json=body).status_code == 201
        assert admin.put(f"/tenants/{tenant}/quota", json=quota).status_code == 200
        key = admin.post(f"/tenants/{tenant}/keys", json={}).json()["key"]
    headers = {"Authorization": f"Bearer {key}"}
    for _ in range(50):  # each replica reloads within its poll interval (0.5 s)
        if all(httpx.get(f"{url}/v1/models", headers=headers).is_success for url in replicas):
            return headers
        time.sleep(0.1)
    raise AssertionError("the second replica did not pick up the new key")


async def fire(
    replicas: list[str], headers: dict[str, str], n: int, body: dict[str, Any]
) -> list[int]:
    """``n`` requests at once, alternating between the replicas; their statuses."""
    async with httpx.AsyncClient(timeout=120) as client:

        async def one(i: int) -> httpx.Response:
            url = f"{replicas[i % 2]}/v1/chat/completions"
            return await client.post(url, json=body, headers=headers)

        responses = await asyncio.gather(*(one(i) for i in range(n)))
    unexpected = [r.text for r in responses if r.status_code not in (200, 429)]
    assert not unexpected, unexpected
    return [r.status_code for r in responses]


def test_two_replicas_admit_exactly_one_limit(replicas: list[str]) -> None:
    headers = metered_key(replicas, "replicated-rpm", requests_per_minute=5)
    statuses = asyncio.run(fire(replicas, headers, 12, SHORT))
    assert sorted(statuses) == [200] * 5 + [429] * 7


def test_two_replicas_share_concurrency_slots(replicas: list[str]) -> None:
    headers = metered_key(replicas, "replicated-slots", max_concurrent_requests=2)

    async def hold_two_then_try() -> tuple[list[int], list[int]]:
        async with httpx.AsyncClient(timeout=120) as client:
            held = []
            streams = []
            for url in replicas:  # one long stream on each replica
                request = client.build_request(
                    "POST", f"{url}/v1/chat/completions", json=LONG_STREAM, headers=headers
                )
                response = await client.send(request, stream=True)
                held.append(response.status_code)
                lines = response.aiter_lines()
                assert (await anext(lines)).startswith("data: ")
                streams.append((response, lines))
            refused = await fire(replicas, headers, 2, SHORT)
            for response, lines in streams:
                await lines.aclose()
                await response.aclose()
        return held, refused

    held, refused = asyncio.run(hold_two_then_try())
    assert held == [200, 200]
    assert refused == [429, 429]
    # Cancelling both streams freed both slots on the shared store: each replica learns of
    # its client's leaving and settles in the background, within moments, not at once.
    deadline = time.monotonic() + 10
    while (after := asyncio.run(fire(replicas, headers, 2, SHORT))) != [200, 200]:
        assert time.monotonic() < deadline, after
        time.sleep(0.1)
