"""Where the traced gateway's spans go (``--tracing``): an OTLP/HTTP receiver on loopback, in
the driving process, that decodes each export, counts its spans and drops them, as a
collector's receiver would take them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

HOST = "127.0.0.1"


@dataclass
class SpanSink:
    url: str
    count: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def tracing_env(url: str) -> dict[str, str]:
    """The gateway's environment for tracing on at full sampling, exported to ``url``. The
    batch processor's queue is large enough that no span is dropped at the phases' rates."""
    return {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{url}/v1/traces",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_TRACES_SAMPLER": "always_on",
        "OTEL_BSP_MAX_QUEUE_SIZE": "262144",
    }


@contextmanager
def span_sink() -> Iterator[SpanSink]:
    server = ThreadingHTTPServer((HOST, 0), BaseHTTPRequestHandler)
    sink = SpanSink(f"http://{HOST}:{server.server_address[1]}")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # the connection kept between exports, as a collector's

        def do_POST(self) -> None:
            export = ExportTraceServiceRequest()
            export.ParseFromString(self.rfile.read(int(self.headers["content-length"])))
            spans = sum(
                len(scope.spans) for spans in export.resource_spans for scope in spans.scope_spans
            )
            with sink.lock:
                sink.count += spans
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return None

    server.RequestHandlerClass = Handler
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield sink
    finally:
        server.shutdown()
        server.server_close()


def main() -> None:
    """A receiver in a process of its own (``python -m tools.gateway_cost.spans``): its URL
    on the first line of stdout; once stdin closes, the spans it received on the next."""
    import sys

    with span_sink() as sink:
        print(sink.url, flush=True)
        sys.stdin.read()
    print(sink.count, flush=True)


if __name__ == "__main__":
    main()
