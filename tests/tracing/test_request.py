"""A request's trace (app/tracing/request.py) once it has ended: its spans go to the sinks
and the trace itself lets them go, so that a request's objects left for the garbage collector
(a cycle) do not hold them."""

from __future__ import annotations

import gc

from opentelemetry.sdk.trace import TracerProvider

from app import tracing
from app.overhead import RequestOverhead
from app.tracing import names, request
from app.tracing.records import FinishedTrace


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
