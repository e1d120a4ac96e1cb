"""Quotas on the live gateway: exact admission, OpenAI's 429s and headers,
slots that come back the moment a stream is cancelled."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import LiveGateway

pytestmark = pytest.mark.slow

LONG = [{"role": "user", "content": "Count from 1 to 1000, comma separated."}]


def metered_tenant(gateway: LiveGateway, tenant: str, **quota: Any) -> dict[str, str]:
    """A new tenant (base model allowed) with ``quota``; its key's auth header."""
    with gateway.admin() as admin:
        admin.post("/tenants", json={"id": tenant, "name": tenant, "allow_base_model": True})
        assert admin.put(f"/tenants/{tenant}/quota", json=quota).status_code == 200
        key = admin.post(f"/tenants/{tenant}/keys", json={}).json()["key"]
    return {"Authorization": f"Bearer {key}"}


def chat(gateway: LiveGateway, headers: dict[str, str], **body: Any) -> httpx.Response:
    payload = {"model": gateway.settings.base_model_id, "messages": LONG, "max_tokens": 4, **body}
    return httpx.post(
        f"{gateway.base_url}/v1/chat/completions", json=payload, headers=headers, timeout=120
    )


def test_rate_limits_admit_exactly_the_limit_with_openai_headers(gateway: LiveGateway) -> None:
    headers = metered_tenant(gateway, "rpm", requests_per_minute=3, tokens_per_minute=100_000)
    responses = [chat(gateway, headers) for _ in range(4)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    first = responses[0].headers
    assert first["x-ratelimit-limit-requests"] == "3"
    assert first["x-ratelimit-remaining-requests"] == "2"
    assert first["x-ratelimit-limit-tokens"] == "100000"
    assert {"x-ratelimit-reset-requests", "x-ratelimit-remaining-tokens"} <= set(first)
    refused = responses[3]
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(refused.headers["retry-after"]) <= 20  # GCRA: one request per 20 s
    assert refused.headers["x-request-id"]


def test_concurrency_slots_are_exact_and_freed_when_a_stream_is_cancelled(
    gateway: LiveGateway,
) -> None:
    headers = metered_tenant(gateway, "slots", max_concurrent_requests=2)
    url = f"{gateway.base_url}/v1/chat/completions"
    body = {
        "model": gateway.settings.base_model_id,
        "messages": LONG,
        "max_tokens": 600,
        "temperature": 0,
        "stream": True,
    }

    async def all_at_once() -> list[int]:
        statuses: list[int] = []
        everyone_answered = asyncio.Event()
        async with httpx.AsyncClient(timeout=120) as client:

            async def one() -> None:
                async with client.stream("POST", url, json=body, headers=headers) as response:
                    statuses.append(response.status_code)
                    if len(statuses) == 6:
                        everyone_answered.set()
                    if response.status_code == 200:
                        # Keep the line iterator referenced: a dropped one is
                        # finalised, which closes the connection (and the slot).
                        lines = response.aiter_lines()
                        assert (await anext(lines)).startswith("data: ")
                        # Hold the slot until every request has been answered.
                        await asyncio.wait_for(everyone_answered.wait(), timeout=60)
                        await lines.aclose()

            await asyncio.gather(*(one() for _ in range(6)))
        return statuses

    statuses = asyncio.run(all_at_once())
    assert sorted(statuses) == [200, 200, 429, 429, 429, 429]
    # Both streams were cancelled mid-answer: their slots are free at once.
    assert gateway.wait_idle() == 0
    assert chat(gateway, headers).status_code == 200


def test_budget_stops_at_the_cap(gateway: LiveGateway) -> None:
    headers = metered_tenant(gateway, "budget", token_budget=300, budget_period="day")
    first = chat(gateway, headers, max_tokens=5)
    assert first.status_code == 200
    spent = first.json()["usage"]["total_tokens"]
    assert spent < 150
    statuses = [chat(gateway, headers, max_tokens=5) for _ in range(300 // spent + 1)]
    assert statuses[-1].status_code == 429
    final = statuses[-1]
    assert final.json()["error"]["code"] == "insufficient_quota"
    assert final.headers["x-should-retry"] == "false"
    charged = spent + sum(r.json()["usage"]["total_tokens"] for r in statuses if r.is_success)
    assert charged <= 300  # never past the cap


def test_a_request_that_can_never_fit_is_a_400_not_a_429(gateway: LiveGateway) -> None:
    headers = metered_tenant(gateway, "tiny", tokens_per_minute=50)
    response = chat(gateway, headers, max_tokens=100)
    assert response.status_code == 400
    assert "50" in response.json()["error"]["message"]
    assert chat(gateway, headers, max_tokens=2).status_code == 200


def test_quota_changes_apply_at_once(gateway: LiveGateway) -> None:
    headers = metered_tenant(gateway, "changing", requests_per_minute=1)
    assert [chat(gateway, headers).status_code for _ in range(2)] == [200, 429]
    with gateway.admin() as admin:
        admin.put("/tenants/changing/quota", json={"requests_per_minute": 1000})
    assert chat(gateway, headers).status_code == 200
    with gateway.admin() as admin:
        admin.put("/tenants/changing/quota", json={})  # no limits at all
    assert all(chat(gateway, headers).status_code == 200 for _ in range(3))
