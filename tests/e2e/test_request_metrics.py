"""Request-level metrics on /metrics count exactly what a tenant was served."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.harness import ADMIN_TOKEN
from tests.support.live_gateway import LiveGateway

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Name a colour."}]


def samples(gateway: LiveGateway) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    # /metrics names every tenant: only for the metrics token or an admin token.
    credentials = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    text = httpx.get(f"{gateway.base_url}/metrics", headers=credentials).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(
    found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


def test_requests_tokens_latency_and_rejections_per_tenant(gateway: LiveGateway) -> None:
    with gateway.admin_client() as admin:
        admin.post("/tenants", json={"id": "observed", "name": "O", "allow_base_model": True})
        admin.put("/tenants/observed/quota", json={"requests_per_minute": 4})
        key = admin.post("/tenants/observed/keys", json={}).json()["key"]
        metered = admin.post("/tenants/observed/keys", json={}).json()
        quota = {"tokens_per_minute": 5}
        put = admin.put(f"/tenants/observed/keys/{metered['id']}/quota", json=quota)
        assert put.status_code == 200, put.text
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=key, max_retries=0)
    base = gateway.settings.base_model_id
    # Refused by the key's own limit once read (400): one of the tenant's requests, no tokens.
    with pytest.raises(openai.BadRequestError):
        client.with_options(api_key=metered["key"]).chat.completions.create(
            model=base, messages=MESSAGES, max_tokens=6
        )
    answer = client.chat.completions.create(model=base, messages=MESSAGES, max_tokens=6)
    chunks = list(
        client.chat.completions.create(
            model=base,
            messages=MESSAGES,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    # Refused once read (404): the tenant's fourth request.
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="not-granted", messages=MESSAGES, max_tokens=6)
    # Refused from the key, before its body is read (its model is not known).
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model=base, messages=MESSAGES, max_tokens=6)

    found = samples(gateway)
    tenant = {"tenant": "observed"}
    served = {**tenant, "model": base}
    chat = {**served, "endpoint": "chat.completions"}
    assert value(found, "lora_gateway_requests_total", **chat, status="ok") == 2
    unknown = {**tenant, "model": "(unknown)", "endpoint": "chat.completions"}
    assert value(found, "lora_gateway_requests_total", **unknown, status="rate_limit_exceeded") == 1
    assert value(found, "lora_gateway_requests_total", **unknown, status="model_not_found") == 1
    rejections = "lora_gateway_quota_rejections_total"
    assert value(found, rejections, **tenant, limit="requests", scope="tenant") == 1
    assert value(found, rejections, **tenant, limit="too_large", scope="key") == 1

    usages = [answer.usage, chunks[-1].usage]
    assert all(u is not None for u in usages)
    assert value(found, "lora_gateway_prompt_tokens_total", **served) == sum(
        u.prompt_tokens for u in usages if u
    )
    completion = sum(u.completion_tokens for u in usages if u)
    assert value(found, "lora_gateway_completion_tokens_total", **served) == completion
    assert value(found, "lora_gateway_time_to_first_token_seconds_count", **served) == 2
    assert value(found, "lora_gateway_queue_wait_seconds_count", **served) == 2
    assert (
        value(found, "lora_gateway_inter_token_latency_seconds_count", **served) == completion - 2
    )
    assert value(found, "lora_gateway_request_duration_seconds_count", **chat) == 2
    assert any(name.startswith("vllm:") for name, _ in found)
