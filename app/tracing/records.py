"""A finished request's spans as plain data (:class:`FinishedTrace`), what
:mod:`app.tracing.request` records and the sinks (:mod:`app.tracing.sinks`) export: no
OpenTelemetry span object is made on the request path.

The request's own span is a :class:`SpanRecord`; its children, which carry no attributes
unless they failed, are rows of one flat list (:data:`ROW` fields each), so that a traced
request in flight holds a few objects for the garbage collector to follow, not one per span."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, NamedTuple

from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import SpanContext, TraceState
from opentelemetry.util.types import AttributeValue

from app.tracing.names import ERROR_TYPE

SERVER: Final = 2
"""OTLP's ``SPAN_KIND_SERVER`` (the request's span); every other span is ``INTERNAL`` (1)."""
INTERNAL: Final = 1
ROW: Final = 5
"""A child span's fields in :attr:`FinishedTrace.children`: its name, its span id (0: not
made yet, :meth:`FinishedTrace.identify`), its parent's span id, its start and its end (ns
since the epoch)."""


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


class Failure(NamedTuple):
    """How a child span failed: its status's message, if any, and its ``error.type``."""

    message: str | None
    error_type: str


class FinishedTrace:
    """A request's ended spans in one trace: its own (``root``, whose parent, where it has
    one, came with the request: ``remote_parent``) and its children, as rows of
    ``children`` (:data:`ROW`); the children that failed, by where their rows begin, in
    ``failures``. A child's span id that is 0 is made by ``ids`` when the trace is read
    (:meth:`identify`): in the export's thread, not on the request's path. (A plain class:
    a frozen dataclass's ``__init__`` would cost the request's end several times more.)"""

    __slots__ = ("children", "failures", "ids", "remote_parent", "root", "trace_id", "trace_state")

    def __init__(
        self,
        trace_id: int,
        trace_state: TraceState | None,
        remote_parent: SpanContext | None,
        root: SpanRecord,
        children: list[Any],
        failures: dict[int, Failure] | None = None,
        ids: IdGenerator | None = None,
    ) -> None:
        self.trace_id = trace_id
        self.trace_state = trace_state
        self.remote_parent = remote_parent
        self.root = root
        self.children = children
        self.failures = failures
        self.ids = ids

    def identify(self) -> None:
        """Give each child that has none yet its span id (from ``ids``)."""
        ids, rows = self.ids, self.children
        if ids is None:
            return
        generate = ids.generate_span_id
        for at in range(1, len(rows), ROW):
            if not rows[at]:
                rows[at] = generate()

    @classmethod
    def of(
        cls,
        trace_id: int,
        trace_state: TraceState | None,
        remote_parent: SpanContext | None,
        spans: Sequence[SpanRecord],
    ) -> FinishedTrace:
        """The trace of ``spans``, the request's first; a child's only attribute may be the
        ``error.type`` of its failure."""
        root, *children = spans
        rows: list[Any] = []
        failures: dict[int, Failure] = {}
        for span in children:
            at = len(rows)
            rows += (span.name, span.span_id, span.parent_id, span.start, span.end)
            attributes = dict(span.attributes or {})
            error_type = attributes.pop(ERROR_TYPE, None)
            if attributes or (error_type is not None and not span.failed):
                raise ValueError(
                    f"{span.name}: a child span carries no attributes but its failure's"
                )
            if span.failed:
                failures[at] = Failure(span.message, str(error_type or "_OTHER"))
        return cls(trace_id, trace_state, remote_parent, root, rows, failures or None)

    @property
    def span_count(self) -> int:
        return 1 + len(self.children) // ROW

    @property
    def spans(self) -> list[SpanRecord]:
        """Every span as a :class:`SpanRecord`, the request's first."""
        self.identify()
        return [self.root, *(self.child(at) for at in range(0, len(self.children), ROW))]

    def child(self, at: int) -> SpanRecord:
        """The child whose row begins at ``at`` in :attr:`children`, as a :class:`SpanRecord`."""
        name, span_id, parent_id, start, end = self.children[at : at + ROW]
        record = SpanRecord(name, span_id, parent_id, start)
        record.end = end
        failure = self.failures.get(at) if self.failures else None
        if failure is not None:
            record.failed, record.message = True, failure.message
            record.attributes = {ERROR_TYPE: failure.error_type}
        return record
