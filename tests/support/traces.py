"""What the tracing tests read spans with: the SDK's in-memory exporter behind the gateway's
tracer (:func:`recorded_spans`), a span tree by name (:class:`Tree`), and an OTLP/HTTP
receiver on loopback that decodes what it is sent (:func:`otlp_receiver`)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from app import tracing

# An incoming trace context, as a caller's ``traceparent`` names it.
PARENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"


@contextmanager
def recorded_spans() -> Iterator[InMemorySpanExporter]:
    """Trace the gateway's requests into an in-memory exporter until the block ends."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    tracing.install(provider, [tracing.to_processor(SimpleSpanProcessor(exporter), provider)])
    try:
        yield exporter
    finally:
        tracing.install(None)


class EngineSpans(SpanProcessor):
    """vLLM's own spans of the requests of an engine in this process, while
    :meth:`recording`: the process's global tracer provider (where vLLM's spans go) hands
    them here, and exports nothing anywhere."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self._on = False

    def on_end(self, span: ReadableSpan) -> None:
        if self._on:
            self.exporter.export((span,))

    @contextmanager
    def recording(self) -> Iterator[InMemorySpanExporter]:
        self.exporter.clear()
        self._on = True
        try:
            yield self.exporter
        finally:
            self._on = False


@functools.cache
def engine_spans() -> EngineSpans:
    """This process's :class:`EngineSpans`, on its global tracer provider (set here unless it
    was): call it before an engine traced in this process starts, whose own provider then
    stays aside."""
    sink = EngineSpans()
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(TracerProvider())
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider), provider
    provider.add_span_processor(sink)
    return sink


@dataclass
class Tree:
    """The finished spans of one trace, by name (one span per name)."""

    spans: dict[str, ReadableSpan] = field(default_factory=dict)

    @classmethod
    def of(cls, spans: Sequence[ReadableSpan], root: ReadableSpan) -> Tree:
        trace_id = root.context.trace_id
        mine = [span for span in spans if span.context.trace_id == trace_id]
        names = [span.name for span in mine]
        assert len(names) == len(set(names)), names
        return cls({span.name: span for span in mine})

    def __getitem__(self, name: str) -> ReadableSpan:
        return self.spans[name]

    def children(self, name: str) -> set[str]:
        parent = self.spans[name].context.span_id
        return {
            span.name
            for span in self.spans.values()
            if span.parent is not None and span.parent.span_id == parent
        }


def roots(spans: Sequence[ReadableSpan]) -> list[ReadableSpan]:
    """The request spans among ``spans`` (the gateway's SERVER spans)."""
    return [span for span in spans if span.name.split(" ")[0] in ("chat", "text_completion")]


@dataclass
class Received:
    """What an OTLP/HTTP receiver was sent: each export, decoded, and its path."""

    exports: list[ExportTraceServiceRequest] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    content_types: list[str] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def spans(self) -> list[object]:
        return [
            span
            for export in self.exports
            for resource in export.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, Received]]:
    """An OTLP/HTTP traces receiver on loopback (its base URL, what it received): it decodes
    each protobuf export and answers 200, as a collector does."""
    received = Received()

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            export = ExportTraceServiceRequest()
            export.ParseFromString(body)
            with received.arrived:
                received.exports.append(export)
                received.paths.append(self.path)
                received.content_types.append(self.headers["content-type"])
                received.arrived.notify_all()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

    with serving(Handler) as port:
        yield f"http://127.0.0.1:{port}", received


class QuietHandler(BaseHTTPRequestHandler):
    """A test server's handler that logs no request line."""

    def log_message(self, format: str, *args: object) -> None:
        return None


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    """``handler`` serving on loopback from a thread, until the block ends: its port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
