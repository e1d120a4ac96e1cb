"""Latency objectives in the front role: each forwarded request carries its class's
objectives in ``vllm_xargs``, which vLLM's server makes the request's ``extra_args``, where
the engine role's slot turns read them; never the client's own ``vllm_xargs``."""

from __future__ import annotations

from pathlib import Path

from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionRequest as VllmChatRequest,
)

from app.inside_vllm.objectives import CLASS_KEY, TPOT_KEY, TTFT_KEY, Objectives
from tests.support.fake_upstream import FakeUpstream
from tests.support.front_app import front_settings, running_front

CHEATING_XARGS = {CLASS_KEY: "interactive", TTFT_KEY: 1}


async def test_the_upstream_body_carries_the_class_objectives_as_vllm_xargs(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    settings = front_settings(
        upstream.url, tmp_path, slo_ttft_ms_interactive=700, slo_ttft_ms_batch=30_000
    )
    async with running_front(settings) as front:
        tenant = {"id": "nightly", "name": "Nightly", "allow_base_model": True}
        await front.admin("POST", "/tenants", {**tenant, "priority": "batch"})
        key = (await front.admin("POST", "/tenants/nightly/keys", {"name": "k"}))["key"]
        body = {
            "model": settings.base_model_id,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3,
            "vllm_xargs": CHEATING_XARGS,
        }
        async with front.client(key) as client:
            response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
    [sent] = upstream.requests
    assert sent.body["vllm_xargs"] == {CLASS_KEY: "batch", TTFT_KEY: 30_000}
    # What the engine role's scheduler then reads, as vLLM's server builds the request.
    params = VllmChatRequest(**sent.body).to_sampling_params(3, {})
    assert Objectives.of(params.extra_args) == Objectives(interactive=False, ttft=30.0)
    assert TPOT_KEY not in sent.body["vllm_xargs"]
