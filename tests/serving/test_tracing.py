"""Traces of the gateway's requests (app/tracing), read with the SDK's in-memory exporter over
a scripted engine: the span tree and its attributes for a stream, a refusal, a client that
leaves and an engine failure; no span per token; an incoming ``traceparent`` honoured and the
engine handed the engine span's; and once over OTLP/HTTP to a receiver on loopback."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from app import access_log, tracing
from app.access_log import AccessLine
from app.tracing import names
from app.tracing.export import OtlpExport
from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import TENANT, Served, ServeFactory, chat, eventually
from tests.support.traces import (
    PARENT_SPAN,
    PARENT_TRACE,
    Tree,
    otlp_receiver,
    recorded_spans,
    roots,
)

PHASES = {"authentication", "resolution", "preparation", "admission", "engine", "settlement"}


async def stream(served: Served, body: dict[str, Any], **headers: str) -> str:
    async with (
        served.client() as client,
        client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response,
    ):
        assert response.status_code == 200
        return (await response.aread()).decode()


def current_trace_id() -> str | None:
    """The trace id of the span current in this context (32 hex digits), if any."""
    span_context = trace.get_current_span().get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid else None


async def request_tree(spans: InMemorySpanExporter, requests: int = 1) -> list[Tree]:
    """The trees of the last ``requests`` requests, once their spans have all ended."""
    await eventually(lambda: len(roots(spans.get_finished_spans())) >= requests)
    finished = spans.get_finished_spans()
    return [Tree.of(finished, root) for root in roots(finished)[-requests:]]


async def test_a_stream_has_one_span_with_a_child_per_step_and_the_genai_attributes(
    serve: ServeFactory, spans: InMemorySpanExporter
) -> None:
    engine = ScriptedEngine()
    async with serve(engine) as served:
        await served.set_quota(tokens_per_minute=100_000)
        await stream(served, chat(served, max_tokens=3, stream=True))
        (tree,) = await request_tree(spans)
        key_id = served.gateway.registry.authenticate(served.key).key_id
    root = tree[f"chat {served.model}"]
    assert root.kind == SpanKind.SERVER and root.parent is None
    assert tree.children(root.name) == PHASES
    assert tree.children("preparation") == {names.QUOTA}
    assert tree.children("engine") == {names.FIRST_TOKEN, names.REST}
    attributes = dict(root.attributes or {})
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == served.model
    assert attributes["gen_ai.response.model"] == served.model
    assert attributes["gen_ai.request.max_tokens"] == 3
    assert attributes["gen_ai.usage.output_tokens"] == 3
    assert attributes["gen_ai.usage.input_tokens"] == len(engine.started()[0].prompt_token_ids)
    assert attributes["gen_ai.response.finish_reasons"] == ("length",)
    assert attributes["lora_gateway.tenant.id"] == TENANT
    assert attributes["lora_gateway.key.id"] == key_id
    assert attributes["lora_gateway.priority"] == "interactive"
    assert attributes["lora_gateway.stream"] is True
    assert attributes["lora_gateway.outcome"] == "ok"
    assert attributes["lora_gateway.queue_wait_ms"] >= 0
    assert served.key not in str(attributes), "the key itself is never traced"
    assert root.status.status_code == StatusCode.UNSET
    # The steps come in order, inside the request's span.
    order = ["authentication", "resolution", "preparation", "admission", "engine", "settlement"]
    starts = [tree[name].start_time or 0 for name in order]
    assert starts == sorted(starts)
    assert (root.start_time or 0) <= starts[0]
    assert (tree["settlement"].end_time or 0) <= (root.end_time or 0)
    first, rest = tree[names.FIRST_TOKEN], tree[names.REST]
    assert (first.end_time or 0) <= (rest.start_time or 0) + 1


async def test_the_engine_is_handed_the_engine_spans_context_and_the_request_span_is_current(
    serve: ServeFactory, spans: InMemorySpanExporter
) -> None:
    seen: list[str | None] = []

    class Watching(ScriptedEngine):
        def generate(self, *args: Any, **kwargs: Any) -> Any:
            seen.append(current_trace_id())
            return super().generate(*args, **kwargs)

    engine = Watching()
    async with serve(engine) as served:
        await stream(served, chat(served, max_tokens=2, stream=True))
        (tree,) = await request_tree(spans)
    engine_span = tree["engine"].context
    handed = engine.started()[0].trace_headers
    assert handed is not None and set(handed) == {"traceparent"}
    _, trace_id, span_id, flags = handed["traceparent"].split("-")
    assert (trace_id, span_id) == (f"{engine_span.trace_id:032x}", f"{engine_span.span_id:016x}")
    assert int(flags, 16) & 1, "sampled"
    assert seen == [f"{engine_span.trace_id:032x}"]
    assert current_trace_id() is None  # outside any request


async def test_the_span_count_does_not_grow_with_the_tokens_streamed(
    serve: ServeFactory, spans: InMemorySpanExporter
) -> None:
    async with serve(ScriptedEngine()) as served:
        await stream(served, chat(served, max_tokens=1, stream=True))
        await stream(served, chat(served, max_tokens=64, stream=True))
        one, many = await request_tree(spans, 2)
    assert set(one.spans) == set(many.spans)
    assert [len(span.events) for span in one.spans.values()] == [
        len(many[name].events) for name in one.spans
    ]
    assert [len(span.attributes or {}) for span in one.spans.values()] == [
        len(many[name].attributes or {}) for name in one.spans
    ]
    assert dict(many[f"chat {served.model}"].attributes or {})["gen_ai.usage.output_tokens"] == 64


async def test_an_incoming_traceparent_is_the_request_spans_parent_and_the_access_lines(
    serve: ServeFactory, spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    parent = f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"
    with caplog.at_level(logging.INFO, logger=access_log.LOGGER.name):
        async with serve(ScriptedEngine()) as served, served.client() as client:
            await stream(served, chat(served, max_tokens=2, stream=True), traceparent=parent)
            unknown = await client.post("/v1/chat/completions", json=chat(served, model="nope"))
            assert unknown.status_code == 404
            tree, refused = await request_tree(spans, 2)
    root = tree[f"chat {served.model}"]
    assert root.context.trace_id == int(PARENT_TRACE, 16)
    assert root.parent is not None and root.parent.span_id == int(PARENT_SPAN, 16)
    assert root.parent.is_remote
    lines = [r.msg for r in caplog.records if isinstance(r.msg, AccessLine)]
    assert [
        (line["status"], line["trace_id"])
        for line in lines
        if line["path"] == "/v1/chat/completions"
    ] == [
        (200, PARENT_TRACE),
        (404, format(refused["chat nope"].context.trace_id, "032x")),
    ]


@pytest.mark.parametrize(
    ("sampler", "traceparent"),
    [
        ("always_off", None),
        ("parentbased_always_on", f"00-{PARENT_TRACE}-{PARENT_SPAN}-00"),
        ("parentbased_traceidratio", None),  # OTEL_TRACES_SAMPLER_ARG 0: none of the traces
    ],
)
async def test_an_unsampled_request_records_nothing_and_hands_its_context_on_unsampled(
    serve: ServeFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    sampler: str,
    traceparent: str | None,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    headers = {"traceparent": traceparent} if traceparent else {}
    engine = ScriptedEngine()
    with (
        recorded_spans() as spans,
        caplog.at_level(logging.INFO, logger=access_log.LOGGER.name),
    ):
        async with serve(engine) as served:
            await stream(served, chat(served, max_tokens=2, stream=True), **headers)
            await served.settled()
    assert spans.get_finished_spans() == ()
    handed = engine.started()[0].trace_headers
    assert handed is not None
    _, trace_id, span_id, flags = handed["traceparent"].split("-")
    assert flags == "00" and int(span_id, 16) != 0
    if traceparent is not None:
        assert trace_id == PARENT_TRACE
    lines = [r.msg for r in caplog.records if isinstance(r.msg, AccessLine)]
    assert [line["trace_id"] for line in lines if line["path"] == "/v1/chat/completions"] == [
        trace_id
    ]


async def test_a_refusal_sets_the_error_status_and_type_and_nothing_runs(
    serve: ServeFactory, spans: InMemorySpanExporter
) -> None:
    engine = ScriptedEngine()
    async with serve(engine) as served, served.client() as client:
        unknown = await client.post("/v1/chat/completions", json=chat(served, model="nope"))
        assert unknown.status_code == 404
        await served.set_quota(tokens_per_minute=10)
        too_large = await client.post("/v1/chat/completions", json=chat(served, max_tokens=50))
        assert too_large.status_code == 400  # more than the limit could ever allow
        no_key = await client.post(
            "/v1/chat/completions", json=chat(served), headers={"authorization": "Bearer x"}
        )
        assert no_key.status_code == 401
        model_refused, quota_refused, key_refused = await request_tree(spans, 3)
    assert engine.started() == []
    root = model_refused["chat nope"]
    assert root.status.status_code == StatusCode.ERROR
    assert dict(root.attributes or {})["error.type"] == unknown.json()["error"]["code"]
    assert dict(root.attributes or {})["http.response.status_code"] == 404
    assert model_refused["resolution"].status.status_code == StatusCode.ERROR
    assert "admission" not in model_refused.spans and "engine" not in model_refused.spans
    quota = quota_refused[names.QUOTA]
    assert quota.status.status_code == StatusCode.ERROR
    assert quota.parent is not None
    assert quota.parent.span_id == quota_refused["preparation"].context.span_id
    quota_root = dict(quota_refused[f"chat {served.model}"].attributes or {})
    assert quota_root["error.type"] == too_large.json()["error"]["code"] == "request_too_large"
    key_root = key_refused["chat"]
    assert key_root.status.status_code == StatusCode.ERROR
    assert dict(key_root.attributes or {})["http.response.status_code"] == 401
    assert set(key_refused.spans) == {"chat", "authentication"}


async def test_a_client_that_leaves_mid_stream_ends_the_trace_once_settled(
    serve: ServeFactory, spans: InMemorySpanExporter
) -> None:
    engine = ScriptedEngine(step_seconds=0.02)
    async with serve(engine) as served:
        body = chat(served, max_tokens=500, stream=True)
        async with (
            served.client() as client,
            client.stream("POST", "/v1/chat/completions", json=body) as response,
        ):
            async for line in response.aiter_lines():
                if '"content"' in line:
                    break
        (tree,) = await request_tree(spans)
        await served.settled()
    root = tree[f"chat {served.model}"]
    attributes = dict(root.attributes or {})
    assert attributes["lora_gateway.outcome"] == "cancelled"
    assert 0 < attributes["gen_ai.usage.output_tokens"] < 500
    assert root.status.status_code == StatusCode.UNSET
    assert {"engine", "settlement"} <= set(tree.children(root.name))
    assert (tree["settlement"].end_time or 0) <= (root.end_time or 0)


async def test_an_engine_failure_is_the_engine_spans_and_the_requests_error(
    serve: ServeFactory, spans: InMemorySpanExporter
) -> None:
    engine = ScriptedEngine(fail_after=1)
    async with serve(engine) as served:
        events = await stream(served, chat(served, max_tokens=5, stream=True))
        assert "error" in events
        (tree,) = await request_tree(spans)
    root = tree[f"chat {served.model}"]
    assert root.status.status_code == StatusCode.ERROR
    assert dict(root.attributes or {})["lora_gateway.outcome"] == "error"
    assert dict(root.attributes or {})["error.type"] == "RuntimeError"
    assert tree["engine"].status.status_code == StatusCode.ERROR
    assert tree["settlement"].status.status_code == StatusCode.UNSET


async def test_traces_reach_an_otlp_http_receiver_as_protobuf(serve: ServeFactory) -> None:
    with otlp_receiver() as (url, received):
        environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_SERVICE_NAME": "gw-test"}
        provider = tracing.setup.provider_for(environ)
        assert provider is not None
        sinks = tracing.sinks_for(environ, provider)
        assert [type(sink) for sink in sinks] == [OtlpExport]
        tracing.install(provider, sinks)
        try:
            async with serve(ScriptedEngine()) as served:
                await stream(served, chat(served, max_tokens=2, stream=True))
                await served.settled()
                assert await asyncio.to_thread(sinks[0].force_flush, 30_000)
        finally:
            tracing.install(None)
            sinks[0].shutdown()
            provider.shutdown()
    assert set(received.paths) == {"/v1/traces"}
    assert set(received.content_types) == {"application/x-protobuf"}
    got = received.spans()
    by_name = {span.name: span for span in got}  # type: ignore[attr-defined]
    assert set(by_name) >= PHASES | {f"chat {served.model}", names.FIRST_TOKEN, names.REST}
    root = by_name[f"chat {served.model}"]
    assert by_name["engine"].parent_span_id == root.span_id
    assert {a.key for a in root.attributes} >= {"gen_ai.request.model", "lora_gateway.tenant.id"}
    resource = received.exports[0].resource_spans[0].resource
    assert {"key": "service.name", "value": "gw-test"} in [
        {"key": a.key, "value": a.value.string_value} for a in resource.attributes
    ]


@pytest.mark.parametrize(
    ("environ", "on", "endpoint"),
    [
        ({}, [], None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ["otlp"], "http://c:4318/v1/traces"),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:9/t", "OTEL_TRACES_EXPORTER": "otlp"},
            ["otlp"],
            "http://c:9/t",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            ["otlp"],
            "http://c:4317",
        ),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp"], "http://localhost:4318/v1/traces"),
        ({"OTEL_TRACES_EXPORTER": "console"}, ["console"], None),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"},
            [],
            None,
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, [], None),
    ],
)
def test_which_variables_turn_tracing_on(
    environ: dict[str, str], on: list[str], endpoint: str | None
) -> None:
    assert tracing.exporters(environ) == on
    assert tracing.traces_endpoint(environ) == endpoint


@pytest.mark.parametrize(
    "environ",
    [
        {"OTEL_TRACES_EXPORTER": "zipkin"},
        {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
    ],
)
def test_what_the_gateway_cannot_honour_is_refused_at_start(environ: dict[str, str]) -> None:
    with pytest.raises(tracing.TracingConfigError):
        tracing.traces_endpoint(environ)


def test_off_by_default_there_is_no_tracer_and_no_trace() -> None:
    from app.overhead import RequestOverhead

    assert tracing.configure({}) is False
    overhead = RequestOverhead("all")
    assert tracing.start(overhead, [(b"traceparent", b"x")], "chat.completions", None) is None
    assert overhead.trace is None
