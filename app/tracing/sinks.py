"""Where a finished request trace goes (:class:`Sink`): OTLP, batched and encoded in a
thread of its own (:class:`app.tracing.export.OtlpExport`), or as the SDK's spans to a span
processor (:class:`ToSpanProcessor`: the console exporter, the tests' in-memory one)."""

from __future__ import annotations

from typing import Final, Protocol

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from app.tracing.records import SERVER, FinishedTrace

_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)
_UNSET: Final = Status(StatusCode.UNSET)


class Sink(Protocol):
    """Takes each sampled request's trace once the request has ended; called on the event
    loop, so it does no more than hand the trace on."""

    def submit(self, finished: FinishedTrace) -> None: ...

    def force_flush(self, timeout_millis: int = 30_000) -> bool: ...

    def shutdown(self) -> None: ...


def readable_spans(
    finished: FinishedTrace, resource: Resource, scope: InstrumentationScope
) -> list[ReadableSpan]:
    """The trace as the SDK's spans, its children first and the request's last."""
    trace_id, state = finished.trace_id, finished.trace_state
    records = finished.spans
    contexts = {
        span.span_id: SpanContext(trace_id, span.span_id, False, _SAMPLED, state)
        for span in records
    }
    out = []
    root, *children = records
    for span in (*children, root):
        parent = finished.remote_parent if span is root else contexts.get(span.parent_id)
        status = Status(StatusCode.ERROR, span.message) if span.failed else _UNSET
        out.append(
            ReadableSpan(
                span.name,
                contexts[span.span_id],
                parent,
                resource,
                dict(span.attributes or {}),
                kind=SpanKind.SERVER if span.kind == SERVER else SpanKind.INTERNAL,
                status=status,
                start_time=span.start,
                end_time=span.end,
                instrumentation_scope=scope,
            )
        )
    return out


class ToSpanProcessor:
    """Each request's spans, as the SDK's, to ``processor`` (which exports them as it
    would the SDK's own)."""

    def __init__(
        self, processor: SpanProcessor, resource: Resource, scope: InstrumentationScope
    ) -> None:
        self.processor = processor
        self._resource = resource
        self._scope = scope

    def submit(self, finished: FinishedTrace) -> None:
        for span in readable_spans(finished, self._resource, self._scope):
            self.processor.on_end(span)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.processor.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self.processor.shutdown()
