"""The front role's traces (app/tracing): the request's span as in-process, and the engine
span's ``traceparent`` sent upstream, where the engine role's vLLM puts its own span under
it; a client's ``traceparent`` is not passed on as it came."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.fake_upstream import FakeUpstream
from tests.support.front_app import Front, front_settings, running_front
from tests.support.serving import eventually
from tests.support.traces import PARENT_SPAN, PARENT_TRACE, Tree, roots


@pytest.fixture(scope="module")
async def front(
    upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Front, str]]:
    state = tmp_path_factory.mktemp("front-tracing")
    async with running_front(front_settings(upstream.url, state)) as front:
        tenant = {"id": "tenant-a", "name": "tenant-a", "allow_base_model": True}
        await front.admin("POST", "/tenants", tenant)
        key = (await front.admin("POST", "/tenants/tenant-a/keys", {"name": "k"}))["key"]
        yield front, key
    shutil.rmtree(state, ignore_errors=True)


@pytest.mark.parametrize("stream", [True, False])
async def test_the_upstream_gets_the_engine_spans_traceparent_under_the_clients(
    front: tuple[Front, str],
    upstream: FakeUpstream,
    spans: InMemorySpanExporter,
    stream: bool,
) -> None:
    app, key = front
    upstream.requests.clear()
    model = app.gateway.registry.base_model_id
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    async with app.client(key) as client:
        answer = await client.post(
            "/v1/chat/completions",
            json=body,
            headers={"traceparent": f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"},
        )
    assert answer.status_code == 200
    await eventually(lambda: bool(roots(spans.get_finished_spans())))
    finished = spans.get_finished_spans()
    (root,) = roots(finished)
    tree = Tree.of(finished, root)
    assert root.context.trace_id == int(PARENT_TRACE, 16)
    assert root.parent is not None and root.parent.span_id == int(PARENT_SPAN, 16)
    assert {"admission", "engine", "settlement"} <= tree.children(root.name)
    engine = tree["engine"].context
    (forwarded,) = upstream.requests
    _, trace_id, span_id, _ = forwarded.headers["traceparent"].split("-")
    assert (trace_id, span_id) == (f"{engine.trace_id:032x}", f"{engine.span_id:016x}")
    attributes = dict(root.attributes or {})
    assert attributes["gen_ai.usage.output_tokens"] == 4  # the upstream's count
    assert attributes["lora_gateway.stream"] is stream
