"""The front role when what is behind it fails (docs/scale-out.md, "Failure modes"):

- the upstream connection torn down mid-answer, as when the engine pod serving it dies (its
  sockets are reset and the inference gateway resets the stream it was proxying): a stream
  ends with one error event and is charged the last counts the upstream streamed; a JSON
  request is a 502 charged its prompt alone;
- Redis down while the front serves: refused with 503 before anything is forwarded (the
  default), or admitted unchecked and still recorded in the ledger (``quota_fail_open``); a
  tenant without limits is served either way;
- PostgreSQL down: keys are still checked against the front's in-memory registry and requests
  served, their usage records held in memory and written once the store is back; ``/readyz``
  stays 200 (the front can serve) and the admin API answers 503 ``store_unavailable``.

The upstream here is a raw TCP server, not tests/support/fake_upstream.py: tearing a
connection down mid-body (no final chunk, an RST) is what an HTTP framework will not do.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import struct
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_upstream import FakeUpstream
from tests.support.front_app import Front, front_settings, running_front
from tests.support.harness import ADMIN_TOKEN
from tests.support.postgres import PostgresCluster
from tests.support.redis_server import redis_server
from tests.support.serving import sse_events

ADAPTER_SOURCE = Path(__file__).resolve().parents[3] / "var/adapters/medical_scribe"
UPSTREAM_PROMPT_TOKENS = 77
"""What the dying upstream counts for any prompt: not what the front counts, so a test can
tell whose count was charged."""


@dataclass
class DyingUpstream:
    """Answers ``GET`` (the readiness probe) with 200; a ``POST`` with ``chunks_before_reset``
    streamed chunks (continuous usage, as vLLM sends when asked), then an RST: no final chunk,
    no ``[DONE]``. With ``chunks_before_reset`` None, the RST comes before any answer."""

    port: int = 0
    chunks_before_reset: int | None = 3
    bodies: list[dict[str, Any]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method = head.split(b" ", 1)[0]
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length)
                if method != b"POST":
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                request = json.loads(body)
                self.bodies.append(request)
                await self._answer_then_die(request, writer)
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def _answer_then_die(self, request: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        if self.chunks_before_reset is not None:
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            role = {"role": "assistant", "content": ""}
            writer.write(_chunk(request["model"], role, completion=0))
            for step in range(1, self.chunks_before_reset + 1):
                writer.write(_chunk(request["model"], {"content": "x"}, completion=step))
            await writer.drain()
            await asyncio.sleep(0.05)
        _reset(writer)


def _chunk(model: str, delta: dict[str, str], completion: int) -> bytes:
    payload = {
        "id": "upstream-id",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
        "usage": {
            "prompt_tokens": UPSTREAM_PROMPT_TOKENS,
            "completion_tokens": completion,
            "total_tokens": UPSTREAM_PROMPT_TOKENS + completion,
        },
    }
    data = f"data: {json.dumps(payload)}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST, as a dead peer's kernel answers, not an orderly FIN."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass
class Setup:
    front: Front
    upstream: DyingUpstream
    key: str


@pytest.fixture(scope="module")
async def setup(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Setup]:
    upstream = DyingUpstream()
    server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0)
    upstream.port = server.sockets[0].getsockname()[1]
    state = tmp_path_factory.mktemp("front-failures")
    shutil.copytree(ADAPTER_SOURCE, state / "adapters" / "medical_scribe")
    settings = front_settings(upstream.url, state, upstream_timeout_seconds=5)
    try:
        async with running_front(settings) as front:
            await front.admin("POST", "/adapters", {"name": "scribe", "path": "medical_scribe"})
            await front.admin("POST", "/tenants", {"id": "tenant-a", "name": "tenant-a"})
            await front.admin("PUT", "/tenants/tenant-a/adapters/notes", {"adapter": "scribe"})
            await front.admin(
                "PUT",
                "/tenants/tenant-a/quota",
                {"token_budget": 100_000, "budget_period": "day", "max_concurrent_requests": 2},
            )
            key = (await front.admin("POST", "/tenants/tenant-a/keys", {"name": "k"}))["key"]
            yield Setup(front, upstream, key)
    finally:
        server.close()
        await server.wait_closed()


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "notes", "messages": [{"role": "user", "content": "hi"}], **fields}


async def budget_used(front: Front) -> int:
    used: int = (await front.admin("GET", "/tenants/tenant-a/quota/usage"))["budget_used"]
    return used


async def test_an_upstream_reset_mid_stream_is_an_error_event_charged_the_last_counts(
    setup: Setup,
) -> None:
    setup.upstream.chunks_before_reset = 3
    known = len(await setup.front.usage_records())
    before = await budget_used(setup.front)
    async with setup.front.client(setup.key) as client:
        response = await client.post("/v1/chat/completions", json=chat(max_tokens=50, stream=True))
    assert response.status_code == 200, response.text
    assert setup.upstream.bodies[-1]["model"] == "scribe@v1"
    events = sse_events(response.text)
    content = [e for e in events[:-2] if e["choices"][0]["delta"].get("content")]
    assert len(content) == 3
    assert all(e["model"] == "notes" for e in events[:-2])
    assert events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert (error["code"], error["type"]) == ("upstream_error", "server_error")
    [*_, record] = await setup.front.records_after(known)
    assert (record.status, record.prompt_tokens, record.completion_tokens) == (
        "error",
        UPSTREAM_PROMPT_TOKENS,
        3,
    )
    assert await budget_used(setup.front) - before == UPSTREAM_PROMPT_TOKENS + 3
    usage = await setup.front.admin("GET", "/tenants/tenant-a/quota/usage")
    assert usage["concurrent_requests"] == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_an_upstream_reset_before_any_answer_is_a_502_charged_the_prompt(
    setup: Setup, stream: bool
) -> None:
    setup.upstream.chunks_before_reset = None
    known = len(await setup.front.usage_records())
    before = await budget_used(setup.front)
    async with setup.front.client(setup.key) as client:
        response = await client.post(
            "/v1/chat/completions", json=chat(max_tokens=50, stream=stream)
        )
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert (error["code"], error["type"]) == ("upstream_error", "server_error")
    [*_, record] = await setup.front.records_after(known)
    # The upstream counted nothing it sent: the front's own count of the prompt, no completion.
    assert (record.status, record.completion_tokens) == ("error", 0)
    assert record.prompt_tokens != UPSTREAM_PROMPT_TOKENS
    assert await budget_used(setup.front) - before == record.prompt_tokens
    usage = await setup.front.admin("GET", "/tenants/tenant-a/quota/usage")
    assert usage["concurrent_requests"] == 0


# -- Redis down ------------------------------------------------------------------------------


@pytest.mark.parametrize("fail_open", [False, True])
async def test_redis_down_follows_the_fail_open_setting(
    upstream: FakeUpstream, tmp_path: Path, fail_open: bool
) -> None:
    with ExitStack() as redis:
        redis_url = redis.enter_context(redis_server())
        settings = front_settings(
            upstream.url, tmp_path, quota_url=redis_url, quota_fail_open=fail_open
        )
        async with running_front(settings) as front:
            await front.admin(
                "POST", "/tenants", {"id": "t", "name": "t", "allow_base_model": True}
            )
            await front.admin("PUT", "/tenants/t/quota", {"max_concurrent_requests": 4})
            key = (await front.admin("POST", "/tenants/t/keys", {"name": "k"}))["key"]
            # A tenant without limits never asks the quota store.
            await front.admin(
                "POST", "/tenants", {"id": "free", "name": "free", "allow_base_model": True}
            )
            free = (await front.admin("POST", "/tenants/free/keys", {"name": "k"}))["key"]
            body = {
                "model": front.gateway.registry.base_model_id,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2,
            }
            async with front.client(key) as client:
                first = await client.post("/v1/chat/completions", json=body)
                assert first.status_code == 200, first.text
                known = len(await front.usage_records())
                forwarded = len(upstream.requests)
                await asyncio.to_thread(redis.close)
                response = await client.post("/v1/chat/completions", json=body)
                ready = await client.get("/readyz")
            async with front.client(free) as client:
                unlimited = await client.post("/v1/chat/completions", json=body)
            records = await front.usage_records()
    # The quota store is not part of the front's readiness: it serves (or refuses) on its own.
    assert ready.status_code == 200
    assert unlimited.status_code == 200, unlimited.text
    records = [r for r in records[known:] if r.tenant_id == "t"]
    if fail_open:
        assert response.status_code == 200, response.text
        assert len(upstream.requests) == forwarded + 2
        assert [r.status for r in records] == ["ok"]
    else:
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert (error["code"], error["type"]) == ("quota_backend_unavailable", "server_error")
        assert len(upstream.requests) == forwarded + 1  # the unlimited tenant's
        assert records == []


# -- PostgreSQL down ---------------------------------------------------------------------------


@pytest.fixture
def postgres() -> Iterator[PostgresCluster]:
    cluster = PostgresCluster()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.remove()


async def test_postgres_down_the_front_serves_from_its_snapshot_and_stays_ready(
    upstream: FakeUpstream, postgres: PostgresCluster, tmp_path: Path
) -> None:
    store = f"{postgres.server_url}/postgres"
    settings = front_settings(upstream.url, tmp_path, database_url=store)
    async with running_front(settings) as front:
        await front.admin("POST", "/tenants", {"id": "t", "name": "t", "allow_base_model": True})
        key = (await front.admin("POST", "/tenants/t/keys", {"name": "k"}))["key"]
        body = {
            "model": front.gateway.registry.base_model_id,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
        }
        known = len(await front.usage_records())
        async with front.client(key) as client:
            await asyncio.to_thread(postgres.stop)
            served = await client.post("/v1/chat/completions", json=body)
            ready = await client.get("/readyz")
            admin = await client.get(
                "/admin/v1/tenants", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
            )
            await asyncio.to_thread(postgres.start)
        records = await front.usage_records()
    assert served.status_code == 200, served.text
    # The front serves from its registry: it stays in the Service.
    assert ready.status_code == 200
    # The admin API needs the store: a retryable 503, OpenAI-shaped, the cause logged.
    assert admin.status_code == 503, admin.text
    assert admin.json()["error"]["code"] == "store_unavailable"
    # The record of the request served during the outage waited in memory, then was written.
    assert [r.status for r in records[known:]] == ["ok"]
