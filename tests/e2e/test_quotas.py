"""Quotas on the live gateway: exact admission, OpenAI's 429s and headers,
slots that come back the moment a stream is cancelled."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.support.live_gateway import LiveGateway, long_stream

pytestmark = pytest.mark.slow


def metered_tenant(gateway: LiveGateway, tenant: str, **quota: Any) -> dict[str, str]:
    """A new tenant (base model allowed) with ``quota``; its key's auth header."""
    with gateway.admin_client() as admin:
        admin.post("/tenants", json={"id": tenant, "name": tenant, "allow_base_model": True})
        assert admin.put(f"/tenants/{tenant}/quota", json=quota).status_code == 200
        key = admin.post(f"/tenants/{tenant}/keys", json={}).json()["key"]
    return {"Authorization": f"Bearer {key}"}


def chat(gateway: LiveGateway, headers: dict[str, str], **body: Any) -> httpx.Response:
    payload = {**long_stream(gateway.settings.base_model_id), "stream": False, "max_tokens": 4}
    payload.update(body)
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
    body = long_stream(gateway.settings.base_model_id)

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
    with gateway.admin_client() as admin:
        admin.put("/tenants/changing/quota", json={"requests_per_minute": 1000})
    assert chat(gateway, headers).status_code == 200
    with gateway.admin_client() as admin:
        admin.put("/tenants/changing/quota", json={})  # no limits at all
    assert all(chat(gateway, headers).status_code == 200 for _ in range(3))


def test_a_key_quota_is_enforced_on_top_of_its_tenants(gateway: LiveGateway) -> None:
    tight = metered_tenant(gateway, "keyed", requests_per_minute=5)
    with gateway.admin_client() as admin:
        tight_id = admin.get("/tenants/keyed/keys").json()[0]["id"]
        put = admin.put(f"/tenants/keyed/keys/{tight_id}/quota", json={"requests_per_minute": 2})
        assert put.status_code == 200 and put.json()["key_id"] == tight_id
        loose_key = admin.post("/tenants/keyed/keys", json={}).json()["key"]
        loose = {"Authorization": f"Bearer {loose_key}"}
        # a key is only reachable under its own tenant
        assert admin.get(f"/tenants/rpm/keys/{tight_id}/quota").status_code == 404

    # max_tokens=1 keeps the sequence far shorter than GCRA's 12 s between requests
    responses = [chat(gateway, tight, max_tokens=1) for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    # the headers describe the tighter subject, the key
    assert responses[0].headers["x-ratelimit-limit-requests"] == "2"
    assert responses[0].headers["x-ratelimit-remaining-requests"] == "1"
    assert tight_id in responses[2].json()["error"]["message"]
    # The key's refusal charged the tenant nothing: its other key gets the 3 requests left.
    loose_statuses = [chat(gateway, loose, max_tokens=1).status_code for _ in range(4)]
    assert loose_statuses == [200, 200, 200, 429]

    with gateway.admin_client() as admin:
        assert admin.delete(f"/tenants/keyed/keys/{tight_id}/quota").status_code == 204
        cleared = admin.get(f"/tenants/keyed/keys/{tight_id}/quota").json()
        assert cleared["requests_per_minute"] is None
        admin.put("/tenants/keyed/quota", json={})
    assert [chat(gateway, tight).status_code for _ in range(3)] == [200, 200, 200]
