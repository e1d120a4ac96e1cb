"""The Responses API in the front role: a Responses request reaches the upstream as the chat
request it translates to (the allow-listed chat body, the adapter's global name, the tenant's
salt), and the upstream's chat answer and stream come back as a Response and its events,
stored in the front's store."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from openai.types.responses import Response

from tests.support.fake_upstream import CHAT_BODY_KEYS, UPSTREAM_PROMPT_TOKENS, FakeUpstream, Script
from tests.support.front_app import Front, front_settings, running_front
from tests.support.serving import eventually

ADAPTER_SOURCE = Path(__file__).resolve().parents[3] / "var/adapters/medical_scribe"
ALIAS = "notes"
GLOBAL_NAME = "scribe@v1"


@dataclass
class Setup:
    front: Front
    upstream: FakeUpstream
    key: str

    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{self.front.base_url}/v1", api_key=self.key, max_retries=0
        )


@pytest.fixture(scope="module")
async def setup(
    upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Setup]:
    state = tmp_path_factory.mktemp("front-responses")
    shutil.copytree(ADAPTER_SOURCE, state / "adapters" / "medical_scribe")
    async with running_front(front_settings(upstream.url, state)) as front:
        await front.admin("POST", "/adapters", {"name": "scribe", "path": "medical_scribe"})
        await front.admin("POST", "/tenants", {"id": "tenant-a", "name": "A"})
        key = (await front.admin("POST", "/tenants/tenant-a/keys", {"name": "k"}))["key"]
        await front.admin("PUT", f"/tenants/tenant-a/adapters/{ALIAS}", {"adapter": "scribe"})
        yield Setup(front, upstream, key)


@pytest.fixture
def front(setup: Setup) -> Setup:
    setup.upstream.script = Script()
    setup.upstream.requests.clear()
    return setup


async def test_a_response_runs_upstream_as_a_chat_request(front: Setup) -> None:
    client = front.client()
    raw = await client.responses.with_raw_response.create(
        model=ALIAS, input="hi", instructions="Be brief.", max_output_tokens=4
    )
    response = Response.model_validate(raw.parse().to_dict())
    assert raw.headers["x-adapter-version"] == "1"
    [sent] = front.upstream.requests
    assert sent.path == "/v1/chat/completions"
    assert set(sent.body) <= CHAT_BODY_KEYS, set(sent.body) - CHAT_BODY_KEYS
    assert sent.body["model"] == GLOBAL_NAME and sent.body["max_completion_tokens"] == 4
    assert sent.body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    tenant = front.front.gateway.registry.tenant("tenant-a")
    assert tenant is not None and sent.body["cache_salt"] == tenant.cache_salt
    # The upstream's answer, under the tenant's alias, cut at its length.
    assert response.model == ALIAS and response.output_text == "xxxx"
    assert response.status == "incomplete"
    assert response.usage is not None
    assert response.usage.input_tokens == UPSTREAM_PROMPT_TOKENS
    assert GLOBAL_NAME not in raw.http_response.text
    # Stored by the front, and continued: the upstream gets the whole chain.
    assert (await client.responses.retrieve(response.id)).id == response.id
    await client.responses.create(
        model=ALIAS, input="more", previous_response_id=response.id, max_output_tokens=2
    )
    assert [m["content"] for m in front.upstream.requests[1].body["messages"]] == [
        "hi",
        "xxxx",
        "more",
    ]


async def test_a_streamed_response_from_the_upstreams_chunks(front: Setup) -> None:
    front.upstream.script = Script(completion_tokens=3)
    async with front.client().responses.stream(
        model=ALIAS, input="hi", max_output_tokens=3
    ) as stream:
        events = [event async for event in stream]
    kinds = [event.type for event in events]
    # The SDK's get_final_response() knows only response.completed: an output cut at
    # max_output_tokens ends, as at OpenAI, with response.incomplete, which carries it.
    final = events[-1].response  # type: ignore[union-attr]
    [sent] = front.upstream.requests
    assert sent.body["stream"] is True
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-1] == "response.incomplete"
    assert Response.model_validate(final.to_dict()).output_text == "xxx"
    assert final.usage is not None and final.usage.output_tokens == 3


async def test_a_stream_the_upstream_cuts_off_ends_with_response_failed(front: Setup) -> None:
    front.upstream.script = Script(completion_tokens=50, cut_after=2)
    stream = await front.client().responses.create(
        model=ALIAS, input="hi", max_output_tokens=50, stream=True
    )
    events = [event async for event in stream]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.failed"
    failed = events[-1].response  # type: ignore[union-attr]
    assert failed.error is not None and "ended the stream early" in failed.error.message
    assert not any(e.type == "response.completed" for e in events)


async def test_a_background_response_cancelled_is_charged_what_the_upstream_streamed(
    front: Setup,
) -> None:
    """A background response runs upstream as a stream, counted as it goes: a cancel aborts
    it there and charges the tokens it produced, as in-process, not the worst case reserved
    (a non-streamed answer says its counts only at its end, which a cancel never sees)."""
    gateway = front.front
    await gateway.admin(
        "PUT", "/tenants/tenant-a/quota", {"token_budget": 10**6, "budget_period": "day"}
    )
    known = len(await gateway.usage_records())
    before = await budget_used(front)
    front.upstream.script = Script(completion_tokens=200, hold_after=3)
    client = front.client()
    created = await client.responses.create(
        model=ALIAS, input="hi", max_output_tokens=200, background=True
    )
    await eventually(lambda: front.upstream.requests)
    [sent] = front.upstream.requests
    assert sent.body.get("stream") is True
    await eventually(lambda: sent.streamed == 3)
    cancelled = await client.responses.cancel(created.id)
    assert cancelled.status == "cancelled" and cancelled.output == []
    assert await asyncio.to_thread(sent.disconnected.wait, 60)
    # What the front had read of the 3 tokens streamed when the cancel came.
    assert cancelled.usage is not None and 0 < cancelled.usage.output_tokens <= 3
    [*_, record] = await gateway.records_after(known)
    assert (record.endpoint, record.status) == ("responses", "cancelled")
    assert record.completion_tokens == cancelled.usage.output_tokens
    assert record.prompt_tokens == cancelled.usage.input_tokens == UPSTREAM_PROMPT_TOKENS
    assert await budget_used(front) - before == record.prompt_tokens + record.completion_tokens
    usage = await gateway.admin("GET", "/tenants/tenant-a/quota/usage")
    assert usage["concurrent_requests"] == 0
    assert (await client.responses.retrieve(created.id)).usage == cancelled.usage


async def test_a_background_response_runs_to_its_end_and_is_stored(front: Setup) -> None:
    front.upstream.script = Script(completion_tokens=3)
    client = front.client()
    created = await client.responses.create(
        model=ALIAS, input="hi", max_output_tokens=3, background=True
    )
    while (done := await client.responses.retrieve(created.id)).status in ("queued", "in_progress"):
        await asyncio.sleep(0.01)
    assert done.status == "incomplete" and done.output_text == "xxx"
    assert done.usage is not None
    assert (done.usage.input_tokens, done.usage.output_tokens) == (UPSTREAM_PROMPT_TOKENS, 3)


async def test_a_background_response_whose_stream_fails_ends_failed_with_its_counts(
    front: Setup,
) -> None:
    known = len(await front.front.usage_records())
    front.upstream.script = Script(completion_tokens=50, cut_after=2)
    client = front.client()
    created = await client.responses.create(
        model=ALIAS, input="hi", max_output_tokens=50, background=True
    )
    while (done := await client.responses.retrieve(created.id)).status in ("queued", "in_progress"):
        await asyncio.sleep(0.01)
    assert done.status == "failed" and done.output == []
    assert done.error is not None and done.error.code == "server_error"
    assert "ended the stream early" in done.error.message
    assert done.usage is not None and done.usage.output_tokens == 2
    [*_, record] = await front.front.records_after(known)
    assert (record.status, record.completion_tokens) == ("error", 2)


async def budget_used(front: Setup) -> int:
    used: int = (await front.front.admin("GET", "/tenants/tenant-a/quota/usage"))["budget_used"]
    return used
