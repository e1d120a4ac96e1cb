"""The Responses API in the front role: a Responses request reaches the upstream as the chat
request it translates to (the allow-listed chat body, the adapter's global name, the tenant's
salt), and the upstream's chat answer and stream come back as a Response and its events,
stored in the front's store."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from openai.types.responses import Response

from tests.support.fake_upstream import CHAT_BODY_KEYS, UPSTREAM_PROMPT_TOKENS, FakeUpstream, Script
from tests.support.front_app import Front, front_settings, running_front

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
