"""A finished request's spans as plain data (:class:`FinishedTrace`), what
:mod:`app.tracing.request` records and the sinks (:mod:`app.tracing.sinks`) export: no
OpenTelemetry span object is made on the request path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from opentelemetry.trace import SpanContext, TraceState
from opentelemetry.util.types import AttributeValue

SERVER: Final = 2
"""OTLP's ``SPAN_KIND_SERVER`` (the request's span); every other span is ``INTERNAL`` (1)."""
INTERNAL: Final = 1


class SpanRecord:
    """One span: its name and ids, its bounds (ns since the epoch), its attributes and, where
    it failed, ``failed`` with the status's message."""

    __slots__ = (
        "attributes",
        "end",
        "failed",
        "kind",
        "message",
        "name",
        "parent_id",
        "span_id",
        "start",
    )

    def __init__(
        self,
        name: str,
        span_id: int,
        parent_id: int,
        start: int,
        kind: int = INTERNAL,
        attributes: dict[str, AttributeValue] | None = None,
    ) -> None:
        self.name = name
        self.span_id = span_id
        self.parent_id = parent_id
        """The parent span's id; 0: none."""
        self.start = start
        self.end = start
        self.kind = kind
        self.attributes = attributes
        self.failed = False
        self.message: str | None = None


@dataclass(frozen=True, slots=True)
class FinishedTrace:
    """A request's ended spans, its own (the first) and its children, in one trace; the
    request span's parent, where it has one, came with the request (``remote_parent``)."""

    trace_id: int
    trace_state: TraceState | None
    remote_parent: SpanContext | None
    spans: list[SpanRecord]
