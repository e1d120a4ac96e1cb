"""vLLM's own span of a traced request nests under the gateway's engine span, on the shared
engine (started with an OTLP endpoint: tests/e2e/conftest.py), in-process."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.support.live_gateway import LiveGateway
from tests.support.traces import Tree, engine_spans, recorded_spans, roots

pytestmark = pytest.mark.slow

PARENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def test_vllms_span_of_the_request_is_a_child_of_the_gateways_engine_span(
    gateway: LiveGateway,
) -> None:
    with gateway.admin_client() as admin:
        admin.post("/tenants", json={"id": "traced", "name": "T", "allow_base_model": True})
        key = admin.post("/tenants/traced/keys", json={}).json()["key"]
    body = {
        "model": gateway.settings.base_model_id,
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 3,
    }
    headers = {
        "authorization": f"Bearer {key}",
        "traceparent": f"00-{PARENT_TRACE}-00f067aa0ba902b7-01",
    }
    with engine_spans().recording() as vllm_spans, recorded_spans() as ours:
        answer = httpx.post(
            f"{gateway.base_url}/v1/chat/completions", json=body, headers=headers, timeout=120
        )
        assert answer.status_code == 200, answer.text
        deadline = time.monotonic() + 60
        while not (roots(ours.get_finished_spans()) and vllm_spans.get_finished_spans()):
            assert time.monotonic() < deadline, "no span came"
            time.sleep(0.02)
    finished = ours.get_finished_spans()
    (root,) = roots(finished)
    engine = Tree.of(finished, root)["engine"]
    (llm_request,) = vllm_spans.get_finished_spans()
    assert llm_request.name == "llm_request"
    assert llm_request.context.trace_id == int(PARENT_TRACE, 16)
    assert llm_request.parent is not None
    assert llm_request.parent.span_id == engine.context.span_id
    attributes = dict(llm_request.attributes or {})
    assert attributes["gen_ai.usage.completion_tokens"] == 3
