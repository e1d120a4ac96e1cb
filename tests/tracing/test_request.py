"""A request's trace (app/tracing/request.py) once it has ended: its spans go to the sinks
and the trace itself lets them go, so that a request's objects left for the garbage collector
(a cycle) do not hold them; its children's span ids are made as it is exported, but for the
ones something on the request's path needed; a fixed sampler's decision is taken without
calling it, and is the one it makes."""

from __future__ import annotations

import gc

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from app import tracing
from app.overhead import RequestOverhead
from app.tracing import names, otlp, request
from app.tracing.records import ROW, FinishedTrace


class Keeping:
    def __init__(self) -> None:
        self.traces: list[FinishedTrace] = []

    def submit(self, finished: FinishedTrace) -> None:
        self.traces.append(finished)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True

    def shutdown(self) -> None:
        return None


def test_an_ended_trace_holds_none_of_the_spans_it_handed_on() -> None:
    sink = Keeping()
    tracing.install(TracerProvider(), [sink])
    try:
        overhead = RequestOverhead("all")
        trace = request.start(overhead, [], "chat.completions", "req-1")
        assert trace is not None
        with tracing.step(trace, names.QUOTA):
            pass
        trace.begin(names.ADMISSION)
        trace.admitted(0.001)
        trace.close()
    finally:
        tracing.install(None)
    (finished,) = sink.traces
    assert [span.name for span in finished.spans] == [
        "chat",
        names.QUOTA,
        names.ADMISSION,
        names.ENGINE,
    ]
    assert gc.get_referrers(finished.children) == [finished]  # the sink's, no longer the trace's
    assert trace.trace_id  # the trace itself lives on, as the request's objects may


def test_a_childs_span_id_is_made_on_export_unless_something_needed_it_first() -> None:
    sink = Keeping()
    tracing.install(TracerProvider(), [sink])
    try:
        overhead = RequestOverhead("all")
        trace = request.start(overhead, [], "chat.completions", "req-2")
        assert trace is not None
        overhead.begin("preparation")
        with tracing.step(trace, names.QUOTA, under="preparation"):
            pass
        overhead.end("preparation")
        trace.begin(names.ADMISSION)
        handed = trace.admitted(0.001)
        trace.ran(1.0, 2.0, "stop", "ok", None)
        trace.close()
    finally:
        tracing.install(None)
    (finished,) = sink.traces
    rows = finished.children
    made = {rows[at]: rows[at + 1] for at in range(0, len(rows), ROW)}
    # Made on the request's path: the spans others hang under (the engine's, handed on).
    assert {name for name, span_id in made.items() if span_id} == {"preparation", names.ENGINE}
    assert handed["traceparent"].split("-")[2] == f"{made[names.ENGINE]:016x}"
    spans = (
        ExportTraceServiceRequest.FromString(
            otlp.envelope(Resource.create({}), "s", "1")(otlp.spans(finished))
        )
        .resource_spans[0]
        .scope_spans[0]
        .spans
    )
    ids = {span.name: span.span_id for span in spans}
    assert len(set(ids.values())) == len(spans) == 7 and all(ids.values())
    parents = {span.name: span.parent_span_id for span in spans}
    assert parents[names.QUOTA] == ids["preparation"]
    assert parents[names.FIRST_TOKEN] == parents[names.REST] == ids[names.ENGINE]
    assert finished.children[1::ROW] == [int.from_bytes(ids[name], "big") for name in rows[::ROW]]


SAMPLERS = [
    ALWAYS_ON,
    ALWAYS_OFF,
    ParentBased(ALWAYS_ON),
    ParentBased(ALWAYS_OFF),
    ParentBased(ALWAYS_ON, remote_parent_not_sampled=ALWAYS_ON, local_parent_sampled=ALWAYS_OFF),
]
STATE = TraceState([("vendor", "value")])
PARENTS = [
    None,
    SpanContext(0xABC, 0xDEF, True, TraceFlags(TraceFlags.SAMPLED), STATE),
    SpanContext(0xABC, 0xDEF, True, TraceFlags(TraceFlags.DEFAULT), STATE),
    SpanContext(0xABC, 0xDEF, False, TraceFlags(TraceFlags.SAMPLED), STATE),
    SpanContext(0xABC, 0xDEF, False, TraceFlags(TraceFlags.DEFAULT), None),
]


@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda sampler: sampler.get_description())
@pytest.mark.parametrize("as_header", [True, False], ids=["given", "current"])
@pytest.mark.parametrize("parent", PARENTS)
def test_a_fixed_samplers_decision_taken_without_it_is_the_one_it_makes(
    sampler: Sampler, as_header: bool, parent: SpanContext | None
) -> None:
    fixed = request.RequestTracing(sampler, RandomIdGenerator(), [])
    assert fixed.decisions is not None
    called = request.RequestTracing(sampler, RandomIdGenerator(), [])
    called.decisions = None  # the sampler asked
    context = trace.set_span_in_context(NonRecordingSpan(parent)) if parent else None
    token = None if as_header or context is None else otel_context.attach(context)
    try:
        given = context if as_header else None
        made = [
            tracing.trace("chat", given, {names.OPERATION: "chat"}) for tracing in (fixed, called)
        ]
    finally:
        if token is not None:
            otel_context.detach(token)
    assert made[0].sampled == made[1].sampled
    assert made[0].span_context().trace_state == made[1].span_context().trace_state
    under = parent if as_header and parent is not None else None
    assert [m.trace_id == f"{0xABC:032x}" for m in made] == [under is not None] * 2


def test_any_other_sampler_is_called() -> None:
    assert request.static_decisions(TraceIdRatioBased(0.5)) is None
    assert request.static_decisions(ParentBased(TraceIdRatioBased(0.5))) is None


def test_every_sink_gets_the_same_span_ids() -> None:
    first, second = Keeping(), Keeping()
    tracing.install(TracerProvider(), [first, second])
    try:
        trace = request.start(RequestOverhead("all"), [], "chat.completions", "req-3")
        assert trace is not None
        trace.begin(names.ADMISSION)
        trace.close()
    finally:
        tracing.install(None)
    (finished,) = first.traces
    assert second.traces == [finished]
    assert all(finished.children[1::ROW])  # made before either sink could read them


def test_what_an_ended_trace_is_told_changes_nothing_the_sinks_have() -> None:
    sink = Keeping()
    tracing.install(TracerProvider(), [sink])
    try:
        trace = request.start(RequestOverhead("all"), [], "chat.completions", "req-4")
        assert trace is not None
        trace.close()
        (finished,) = sink.traces
        attributes = dict(finished.root.attributes or {})
        trace.used(3, 4)
        trace.failed(RuntimeError("late"))
    finally:
        tracing.install(None)
    assert finished.root.attributes == attributes
    assert not finished.root.failed
