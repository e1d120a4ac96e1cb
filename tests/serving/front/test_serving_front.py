"""The front role over a fake upstream (a real HTTP server on loopback, tests/support/
fake_upstream.py): what is forwarded (an allow-listed body, the global name, the tenant's
cache salt and fairness id, no client header), what comes back (the tenant's alias, no usage
chunk unless asked), what is charged (the upstream's counts), and what an upstream failure
or a client that leaves does."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.inside_vllm.objectives import CLASS_KEY
from app.protocol import ChatCompletionRequest
from app.settings import EMBEDDED_MODEL_DIR
from tests.support.fake_upstream import (
    CHAT_BODY_KEYS,
    UPSTREAM_PROMPT_TOKENS,
    FakeUpstream,
    Script,
)
from tests.support.front_app import Front, front_settings, running_front
from tests.support.harness import ADMIN_TOKEN
from tests.support.scripted_engine import ScriptedEngine
from tests.support.scripted_gateway import run_command
from tests.support.servers import free_port, wait_until_ready
from tests.support.serving import TENANT as IN_PROCESS_TENANT
from tests.support.serving import ServeFactory, sse_events

ADAPTER_SOURCE = Path(__file__).resolve().parents[3] / "var/adapters/medical_scribe"
ALIAS = "notes"
GLOBAL_NAME = "scribe@v1"
ENGINE_SIDE_FIELDS = {
    "priority": 7,
    "cache_salt": "tenant-b",
    "vllm_xargs": {"a": 1},
    "kv_transfer_params": {"do_remote_prefill": True},
    "request_id": "chosen-by-client",
    "lora_request": {"lora_name": GLOBAL_NAME},
}
CLIENT_ROUTING_HEADERS = {
    "x-llm-d-model-name-rewrite": GLOBAL_NAME,
    "x-llm-d-inference-fairness-id": "tenant-b",
    "x-llm-d-inference-objective": "critical",
    "x-gateway-destination-endpoint": "10.0.0.1:8000",
}


@dataclass
class Setup:
    front: Front
    upstream: FakeUpstream
    keys: dict[str, str]
    # usage records before the running test
    known: int = 0


@pytest.fixture(scope="module")
async def setup(
    upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Setup]:
    """One front: tenant-a with the alias ``notes`` for the adapter ``scribe`` and the base
    model, tenant-b with nothing of its own."""
    state = tmp_path_factory.mktemp("front")
    shutil.copytree(ADAPTER_SOURCE, state / "adapters" / "medical_scribe")
    settings = front_settings(upstream.url, state, upstream_timeout_seconds=2)
    async with running_front(settings) as front:
        await front.admin("POST", "/adapters", {"name": "scribe", "path": "medical_scribe"})
        keys = {}
        for tenant, base in (("tenant-a", True), ("tenant-b", False)):
            await front.admin(
                "POST", "/tenants", {"id": tenant, "name": tenant, "allow_base_model": base}
            )
            keys[tenant] = (await front.admin("POST", f"/tenants/{tenant}/keys", {"name": "k"}))[
                "key"
            ]
        await front.admin("PUT", f"/tenants/tenant-a/adapters/{ALIAS}", {"adapter": "scribe"})
        yield Setup(front, upstream, keys)


@pytest.fixture
async def front(setup: Setup) -> Setup:
    """The module's front, with the upstream's script reset and its log emptied."""
    setup.upstream.script = Script()
    setup.upstream.requests.clear()
    await setup.front.admin("PUT", "/tenants/tenant-a/quota", {})
    await setup.front.settled()
    setup.known = len(await setup.front.usage_records())
    return setup


def chat(model: str = ALIAS, **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **fields}


async def post(
    setup: Setup, body: dict[str, Any], tenant: str = "tenant-a", **kwargs: Any
) -> httpx.Response:
    async with setup.front.client(setup.keys[tenant]) as client:
        return await client.post("/v1/chat/completions", json=body, **kwargs)


async def read_then_leave(setup: Setup, body: dict[str, Any], chunks: int) -> int:
    """Stream ``body`` as tenant-a and leave after ``chunks`` chunks with content."""
    received = 0
    async with (
        setup.front.client(setup.keys["tenant-a"]) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        async for line in response.aiter_lines():
            if line.startswith("data: ") and '"content":"x"' in line.replace(" ", ""):
                received += 1
                if received == chunks:
                    break
    return received


async def test_the_upstream_gets_an_allow_listed_body_with_the_global_name_and_tenant_salt(
    front: Setup,
) -> None:
    body = chat(max_tokens=6, temperature=0.5, user="alice", **ENGINE_SIDE_FIELDS)
    response = await post(front, body, headers=CLIENT_ROUTING_HEADERS)
    assert response.status_code == 200, response.text
    [sent] = front.upstream.requests
    assert set(sent.body) <= CHAT_BODY_KEYS, set(sent.body) - CHAT_BODY_KEYS
    assert sent.body["model"] == GLOBAL_NAME
    tenant = front.front.gateway.registry.tenant("tenant-a")
    assert tenant is not None and sent.body["cache_salt"] == tenant.cache_salt != "tenant-a"
    assert sent.body["max_completion_tokens"] == 6
    assert sent.body["temperature"] == 0.5
    assert "stream_options" not in sent.body
    assert sent.body["vllm_xargs"] == {CLASS_KEY: "interactive"}  # the front's, not the client's
    # Headers: the front's own, none of the client's.
    assert sent.headers["x-llm-d-inference-fairness-id"] == "tenant-a"
    assert sent.headers["x-llm-d-inference-objective"] == "interactive"
    assert "x-llm-d-model-name-rewrite" not in sent.headers
    assert not [h for h in sent.headers if h.startswith("x-gateway-")]
    assert "authorization" not in sent.headers
    assert sent.headers["x-request-id"] == response.headers["x-request-id"]
    # The answer: the tenant's name, the gateway's id, none of vLLM's extras.
    answer = response.json()
    assert answer["model"] == ALIAS
    assert answer["id"] == f"chatcmpl-{response.headers['x-request-id']}"
    assert "kv_transfer_params" not in answer and "prompt_token_ids" not in answer
    assert GLOBAL_NAME not in response.text
    assert answer["usage"]["prompt_tokens"] == UPSTREAM_PROMPT_TOKENS


async def test_engine_side_fields_are_ignored_as_in_process(serve: ServeFactory) -> None:
    """The same body in-process: a 200, and the engine gets the tenant's salt, not the
    client's (the protocol ignores fields outside OpenAI's API in both roles)."""
    engine = ScriptedEngine()
    async with serve(engine) as served, served.client() as client:
        body = chat(served.model, max_tokens=3, **ENGINE_SIDE_FIELDS)
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    tenant = served.gateway.registry.tenant(IN_PROCESS_TENANT)
    assert tenant is not None and engine.started()[0].cache_salt == tenant.cache_salt
    parsed = ChatCompletionRequest.model_validate(body)
    assert not set(ENGINE_SIDE_FIELDS) & set(parsed.model_dump(exclude_unset=True))


async def test_the_base_model_goes_by_its_own_id(front: Setup) -> None:
    base = front.front.gateway.registry.base_model_id
    response = await post(front, chat(base, max_tokens=2))
    assert response.status_code == 200, response.text
    assert front.upstream.requests[0].body["model"] == base
    assert response.json()["model"] == base


async def test_a_bad_request_is_refused_before_anything_is_forwarded(front: Setup) -> None:
    too_long = await post(front, chat(max_tokens=100_000))
    assert too_long.status_code == 400
    assert too_long.json()["error"]["param"] == "max_tokens"
    outside = await post(front, chat(max_tokens=2, logit_bias={"99999999": 5}))
    assert outside.status_code == 400
    assert outside.json()["error"]["param"] == "logit_bias"
    tools = [{"type": "function", "function": {"name": "f"}}]
    auto = await post(front, chat(tools=tools))
    assert auto.status_code == 400
    assert auto.json()["error"]["param"] == "tool_choice"
    # vLLM's server decodes a forced call only with a tool-call parser: none is configured.
    for choice in ("required", {"type": "function", "function": {"name": "f"}}):
        forced = await post(front, chat(tools=tools, tool_choice=choice))
        assert forced.status_code == 400, forced.text
        assert forced.json()["error"]["param"] == "tool_choice"
    assert front.upstream.requests == []


async def test_another_tenant_cannot_reach_an_adapter_by_alias_or_global_name(front: Setup) -> None:
    for model in (ALIAS, GLOBAL_NAME):
        response = await post(front, chat(model, max_tokens=2), tenant="tenant-b")
        assert response.status_code == 404, response.text
        error = response.json()["error"]
        assert error["code"] == "model_not_found"
        assert "tenant-a" not in response.text
        assert ALIAS not in response.text or model == ALIAS
    # Not by its owner either: a tenant names its adapters by alias only.
    own = await post(front, chat(GLOBAL_NAME, max_tokens=2))
    assert own.status_code == 404
    assert front.upstream.requests == []


async def test_a_stream_carries_the_alias_and_no_usage_chunk_unless_asked(front: Setup) -> None:
    front.upstream.script = Script(completion_tokens=3)
    response = await post(front, chat(max_tokens=3, stream=True))
    assert response.status_code == 200, response.text
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["model"] == ALIAS and c["usage"] is None and c["choices"] for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "xxx"
    sent = front.upstream.requests[0].body
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}

    # Request metrics stay in the front: the stream's first token was timed.
    ttft = "lora_gateway_time_to_first_token_seconds_count"
    assert front.front.samples(ttft, tenant="tenant-a", model=ALIAS) >= 1

    asked = await post(
        front, chat(max_tokens=3, stream=True, stream_options={"include_usage": True})
    )
    *content, usage, done = sse_events(asked.text)
    assert done == "[DONE]"
    assert usage["choices"] == [] and usage["model"] == ALIAS
    assert usage["usage"] == {
        "prompt_tokens": UPSTREAM_PROMPT_TOKENS,
        "completion_tokens": 3,
        "total_tokens": UPSTREAM_PROMPT_TOKENS + 3,
    }
    assert all(c["usage"] is None for c in content)


@pytest.mark.parametrize("stream", [False, True])
async def test_settlement_is_the_upstreams_usage(front: Setup, stream: bool) -> None:
    await front.front.admin(
        "PUT",
        "/tenants/tenant-a/quota",
        {"token_budget": 100_000, "budget_period": "day", "max_concurrent_requests": 2},
    )
    front.upstream.script = Script(completion_tokens=5)
    before = (await front.front.admin("GET", "/tenants/tenant-a/quota/usage"))["budget_used"]
    response = await post(front, chat(max_tokens=50, n=2, stream=stream))
    assert response.status_code == 200, response.text
    record = (await front.front.records_after(front.known))[-1]
    assert (record.status, record.prompt_tokens, record.completion_tokens) == (
        "ok",
        UPSTREAM_PROMPT_TOKENS,
        10,
    )
    assert (record.model, record.adapter, record.tenant_id) == (ALIAS, "scribe", "tenant-a")
    usage = await front.front.admin("GET", "/tenants/tenant-a/quota/usage")
    assert usage["concurrent_requests"] == 0
    assert usage["budget_used"] - before == UPSTREAM_PROMPT_TOKENS + 10


async def test_a_client_that_leaves_a_stream_closes_the_upstream_and_pays_what_it_got(
    front: Setup,
) -> None:
    await front.front.admin(
        "PUT", "/tenants/tenant-a/quota", {"token_budget": 100_000, "budget_period": "day"}
    )
    front.upstream.script = Script(completion_tokens=400, step_seconds=0.02)
    before = (await front.front.admin("GET", "/tenants/tenant-a/quota/usage"))["budget_used"]
    received = await read_then_leave(front, chat(max_tokens=400, stream=True), chunks=10)
    [sent] = front.upstream.requests
    assert await asyncio.to_thread(sent.disconnected.wait, 10), (
        "the upstream connection stayed open"
    )
    [*_, record] = await front.front.records_after(front.known)
    assert record.status == "cancelled"
    assert received <= record.completion_tokens <= sent.streamed < 400
    usage = await front.front.admin("GET", "/tenants/tenant-a/quota/usage")
    assert usage["budget_used"] - before == UPSTREAM_PROMPT_TOKENS + record.completion_tokens


@pytest.mark.parametrize("interval", [1, 4])
async def test_a_client_that_leaves_a_stream_pays_what_its_chunks_may_hold_unsent(
    front: Setup, interval: int
) -> None:
    """Chunks of ``stream_interval`` tokens: the upstream may have produced up to that many
    less one that the front never saw (its abort's last counts never reach the front), and
    they are charged rather than given away."""
    front.upstream.script = Script(completion_tokens=100, hold_after=10)
    body = chat(max_tokens=100, stream=True, stream_interval=interval)
    await read_then_leave(front, body, chunks=10)
    [sent] = front.upstream.requests
    assert sent.body.get("stream_interval", 1) == interval
    assert await asyncio.to_thread(sent.disconnected.wait, 10)
    [*_, record] = await front.front.records_after(front.known)
    assert (record.status, record.completion_tokens) == ("cancelled", 10 + interval - 1)


async def test_a_choice_that_finished_holds_nothing_unsent(front: Setup) -> None:
    """Of ``n`` choices, one finished (its last chunk goes at once) and one cut short: only
    the unfinished one may hold tokens the front never saw."""
    front.upstream.script = Script(choice_tokens=(5, 100), hold_after=10)
    body = chat(max_tokens=100, n=2, stream=True, stream_interval=4)
    assert await read_then_leave(front, body, chunks=15) == 15
    [sent] = front.upstream.requests
    assert await asyncio.to_thread(sent.disconnected.wait, 10)
    [*_, record] = await front.front.records_after(front.known)
    assert (record.status, record.completion_tokens) == ("cancelled", 5 + 10 + 4 - 1)


async def test_a_stream_asks_the_upstream_for_the_deployments_interval_or_the_requests(
    front: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At least ``LORA_GATEWAY_STREAM_INTERVAL`` tokens a chunk, more where the request asks;
    a JSON answer has no chunks."""
    monkeypatch.setattr(front.front.gateway.backend.upstream, "stream_interval", 4)
    for fields, sent_interval in [
        ({"stream": True}, 4),
        ({"stream": True, "stream_interval": 2}, 4),
        ({"stream": True, "stream_interval": 8}, 8),
        ({"stream_interval": 8}, None),
    ]:
        assert (await post(front, chat(max_tokens=2, **fields))).status_code == 200
        assert front.upstream.requests[-1].body.get("stream_interval") == sent_interval


async def test_a_client_that_leaves_before_the_first_chunk_closes_the_upstream(
    front: Setup,
) -> None:
    """The response waits for the upstream's first chunk (so that a refusal keeps its
    status): a client that leaves meanwhile is noticed, and is charged no completion."""
    front.upstream.script = Script(hang=True)
    async with front.front.client(front.keys["tenant-a"]) as client:
        body = chat(max_tokens=100, stream=True)
        call = asyncio.create_task(client.post("/v1/chat/completions", json=body))
        await asyncio.to_thread(front.upstream.wait_for_requests, 1)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    assert await asyncio.to_thread(front.upstream.requests[0].disconnected.wait, 10)
    [*_, record] = await front.front.records_after(front.known)
    assert (record.status, record.completion_tokens) == ("cancelled", 0)


async def test_an_abandoned_json_request_closes_the_upstream_and_pays_its_reservation(
    front: Setup,
) -> None:
    front.upstream.script = Script(completion_tokens=100, step_seconds=0.05)
    async with front.front.client(front.keys["tenant-a"]) as client:
        call = asyncio.create_task(
            client.post("/v1/chat/completions", json=chat(max_tokens=100, n=2))
        )
        await asyncio.to_thread(front.upstream.wait_for_requests, 1)
        await asyncio.sleep(0.2)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    assert await asyncio.to_thread(front.upstream.requests[0].disconnected.wait, 10)
    [*_, record] = await front.front.records_after(front.known)
    assert (record.status, record.completion_tokens) == ("cancelled", 200)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("script", "status", "code"),
    [
        (Script(status=500), 502, "upstream_error"),
        (Script(status=503), 503, "upstream_unavailable"),
        (Script(hang=True), 504, "upstream_timeout"),
    ],
)
async def test_upstream_failures_are_openai_errors(
    front: Setup, script: Script, status: int, code: str, stream: bool
) -> None:
    front.upstream.script = script
    response = await post(front, chat(max_tokens=2, stream=stream))
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["code"], error["type"]) == (code, "server_error")
    [*_, record] = await front.front.records_after(front.known)
    assert (record.status, record.completion_tokens) == ("error", 0)


async def test_an_upstream_refusal_is_passed_on_without_the_global_name(front: Setup) -> None:
    refusal = {
        "error": {
            "message": f"The model `{GLOBAL_NAME}` cannot take `seed` here.",
            "type": "BadRequestError",
            "param": "seed",
            "code": 400,
        }
    }
    front.upstream.script = Script(status=400, error=refusal)
    for stream in (False, True):
        response = await post(front, chat(max_tokens=2, stream=stream))
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["message"] == f"The model `{ALIAS}` cannot take `seed` here."
        assert error["param"] == "seed"
        # OpenAI's type, not vLLM's class name; vLLM's numeric code is not an OpenAI code.
        assert (error["type"], error["code"]) == ("invalid_request_error", None)
        assert GLOBAL_NAME not in response.text


async def test_a_pool_shedding_load_is_a_429_with_its_retry_after(front: Setup) -> None:
    shed = {"error": {"message": "Too many requests", "type": "RateLimitError", "code": 429}}
    front.upstream.script = Script(status=429, error=shed, error_headers={"Retry-After": "3"})
    for stream in (False, True):
        response = await post(front, chat(max_tokens=2, stream=stream))
        assert response.status_code == 429, response.text
        assert response.headers["retry-after"] == "3"
        assert response.json()["error"]["type"] == "requests"


async def test_a_stream_the_upstream_cuts_is_an_error_event_charged_what_it_streamed(
    front: Setup,
) -> None:
    front.upstream.script = Script(completion_tokens=20, cut_after=4)
    response = await post(front, chat(max_tokens=20, stream=True))
    assert response.status_code == 200
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == "upstream_error"
    [*_, record] = await front.front.records_after(front.known)
    assert (record.status, record.completion_tokens) == ("error", 4)


async def test_text_completions_are_forwarded_too(front: Setup) -> None:
    async with front.front.client(front.keys["tenant-a"]) as client:
        body = {
            "model": ALIAS,
            "prompt": "Once",
            "max_tokens": 4,
            "echo": True,
            "best_of": 1,
            "priority": 3,
        }
        response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == ALIAS
    sent = front.upstream.requests[0]
    assert sent.path == "/v1/completions"
    assert sent.body["max_tokens"] == 4 and sent.body["echo"] is True
    assert "priority" not in sent.body and "best_of" not in sent.body


async def test_an_unreachable_upstream_is_a_503_and_the_front_stays_ready(
    tmp_path: Path,
) -> None:
    settings = front_settings(f"http://127.0.0.1:{free_port()}", tmp_path)
    async with running_front(settings) as front:
        async with httpx.AsyncClient(base_url=front.base_url) as client:
            ready = await client.get("/readyz")
        # Every front shares the upstream: its outage must not take them all out of the
        # Service, where clients would get the ingress's 503 instead of the one below.
        assert ready.status_code == 200
        await front.admin("POST", "/tenants", {"id": "t", "name": "t", "allow_base_model": True})
        key = (await front.admin("POST", "/tenants/t/keys", {"name": "k"}))["key"]
        async with front.client(key) as client:
            for stream in (False, True):
                body = chat(front.gateway.registry.base_model_id, max_tokens=2, stream=stream)
                response = await client.post("/v1/chat/completions", json=body)
                assert response.status_code == 503, response.text
                assert response.json()["error"]["code"] == "upstream_unavailable"


def test_the_fake_upstream_is_what_the_tests_think(upstream: FakeUpstream) -> None:
    """The fake answers a usage chunk only when asked, as vLLM does: the usage-dropping test
    would pass vacuously otherwise."""
    upstream.script = Script(completion_tokens=2)
    body = {"model": "m", "messages": [], "stream": True, "stream_options": {"include_usage": True}}
    text = httpx.post(f"{upstream.url}/v1/chat/completions", json=body).text
    assert any(e != "[DONE]" and e["choices"] == [] for e in sse_events(text))
    text = httpx.post(
        f"{upstream.url}/v1/chat/completions", json={**body, "stream_options": None}
    ).text
    assert not any(e != "[DONE]" and e.get("usage") for e in sse_events(text))
    assert json.loads(httpx.post(f"{upstream.url}/v1/completions", json={"model": "m"}).text)[
        "usage"
    ]


def test_lora_gateway_serve_runs_the_front_role(
    fork_server: ForkServerContext, upstream: FakeUpstream, tmp_path: Path
) -> None:
    """``lora-gateway serve`` with LORA_GATEWAY_ROLE=front: no engine, ready once the upstream
    answers, requests forwarded; it stops cleanly."""
    upstream.script = Script()
    upstream.requests.clear()
    port = free_port()
    env = {
        **os.environ,
        "LORA_GATEWAY_ROLE": "front",
        "LORA_GATEWAY_UPSTREAM_URL": upstream.url,
        "LORA_GATEWAY_PORT": str(port),
        "LORA_GATEWAY_MODEL": str(EMBEDDED_MODEL_DIR.resolve()),
        "LORA_GATEWAY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}",
        "LORA_GATEWAY_ADAPTER_ROOT": str(tmp_path / "adapters"),
        "LORA_GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN,
    }
    log = tmp_path / "front.log"
    # The command in a process forked from one that imported the gateway already.
    process = fork_server.Process(target=run_command, args=(["serve"], env, log))
    process.start()
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(f"{base_url}/readyz", alive=process.is_alive, timeout=120)
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        tenant = {"id": "t", "name": "t", "allow_base_model": True}
        assert httpx.post(f"{base_url}/admin/v1/tenants", json=tenant, headers=admin).is_success
        key = httpx.post(f"{base_url}/admin/v1/tenants/t/keys", json={"name": "k"}, headers=admin)
        body = chat(EMBEDDED_MODEL_DIR.name, max_tokens=2)
        answer = httpx.post(
            f"{base_url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key.json()['key']}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        assert [r.body["model"] for r in upstream.requests] == [EMBEDDED_MODEL_DIR.name]
    finally:
        # SIGINT: the stop asked for (app/server.py), which exits 0.
        os.kill(process.pid, signal.SIGINT)
        process.join(60)
        if process.exitcode is None:
            process.kill()
            process.join()
    assert process.exitcode == 0, log.read_text()[-3000:]
