"""A request's trace (app/tracing/request.py) once it has ended: its spans go to the sinks
and the trace itself lets them go, so that a request's objects left for the garbage collector
(a cycle) do not hold them; its children's span ids are made as it is exported, but for the
ones something on the request's path needed."""

from __future__ import annotations

import gc

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

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
