"""Request traces leaving the process (app/tracing/export.py): batched as the ``OTEL_BSP_*``
variables say, a full queue dropping (and counting) rather than growing, everything queued
sent on a flush and at shutdown; the SDK's OTLP exporters sending the encoded bytes over HTTP
and over gRPC to receivers on loopback (over HTTP with one kept http.client connection where
requests would add nothing, with requests where a proxy, a credential provider or TLS is
involved); a sink for each exporter named."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any

import grpc
import pytest
from opentelemetry.exporter.http.transport._requests import RequestsHTTPTransport
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from app import tracing
from app.tracing import export, otlp
from app.tracing.records import SERVER, FinishedTrace, SpanRecord
from app.tracing.setup import SCOPE
from app.tracing.sinks import ToSpanProcessor
from app.tracing.transport import PlainHttpTransport
from tests.support.traces import otlp_receiver

ENVELOPE = otlp.envelope(Resource.create({"service.name": "gw-test"}), SCOPE.name, "1")


def finished(trace_id: int, spans: int = 3) -> FinishedTrace:
    root = SpanRecord("chat m", 1, 0, 1_000, SERVER, {"lora_gateway.tenant.id": "t"})
    children = [SpanRecord(f"step{n}", n + 2, 1, 1_000 + n) for n in range(spans - 1)]
    return FinishedTrace.of(trace_id, None, None, [root, *children])


def span_count(request: bytes) -> int:
    decoded = ExportTraceServiceRequest.FromString(request)
    return sum(len(scope.spans) for rs in decoded.resource_spans for scope in rs.scope_spans)


class Recording:
    """A sender that keeps what it is given."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, int]] = []  # (spans decoded, spans said)
        self.shut = False

    def send(self, request: bytes, spans: int) -> bool:
        self.sent.append((span_count(request), spans))
        return True

    def shutdown(self) -> None:
        self.shut = True


def test_a_flush_sends_everything_queued_in_batches_of_at_most_the_batch_size() -> None:
    sender = Recording()
    environ = {"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "7", "OTEL_BSP_SCHEDULE_DELAY": "60000"}
    exporting = export.OtlpExport(sender, ENVELOPE, environ)
    try:
        for trace_id in range(1, 6):  # fewer spans than a batch: they wait for the flush
            exporting.submit(finished(trace_id))
        assert exporting.force_flush(10_000)
        assert sum(decoded for decoded, _ in sender.sent) == 15
        assert all(decoded == said for decoded, said in sender.sent)
        # A trace is never split: two traces of 3 spans to a batch of at most 7.
        assert [decoded for decoded, _ in sender.sent] == [6, 6, 3]
    finally:
        exporting.shutdown()
    assert sender.shut


def sent_within(sender: Recording, posts: int, seconds: float = 10) -> list[int]:
    """The spans of each request ``sender`` was given, once it was given ``posts``."""
    deadline = time.monotonic() + seconds
    while len(sender.sent) < posts and time.monotonic() < deadline:
        time.sleep(0.01)
    return [decoded for decoded, _ in sender.sent]


def test_a_full_batch_goes_at_once_alone_and_the_rest_waits_for_the_schedule() -> None:
    sender = Recording()
    environ = {"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "7", "OTEL_BSP_SCHEDULE_DELAY": "60000"}
    exporting = export.OtlpExport(sender, ENVELOPE, environ)
    try:
        for trace_id in range(1, 4):  # 9 spans: a batch of 6 (traces are not split) is full
            exporting.submit(finished(trace_id))
        assert sent_within(sender, 1) == [6]
        # The third trace waits for a batch to fill, the schedule or a flush: not sent alone.
        assert exporting.force_flush(10_000)
        assert [decoded for decoded, _ in sender.sent] == [6, 3]
    finally:
        exporting.shutdown()


def test_the_schedule_sends_what_is_queued_without_a_full_batch() -> None:
    sender = Recording()
    environ = {"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "512", "OTEL_BSP_SCHEDULE_DELAY": "20"}
    exporting = export.OtlpExport(sender, ENVELOPE, environ)
    try:
        exporting.submit(finished(1))
        assert sent_within(sender, 1) == [3]
        exporting.submit(finished(2, spans=2))
        assert sent_within(sender, 2) == [3, 2]
    finally:
        exporting.shutdown()


def test_a_full_queue_drops_and_counts_and_shutdown_sends_what_is_queued() -> None:
    sender = Recording()
    environ = {"OTEL_BSP_MAX_QUEUE_SIZE": "9", "OTEL_BSP_SCHEDULE_DELAY": "60000"}
    exporting = export.OtlpExport(sender, ENVELOPE, environ)
    for trace_id in range(1, 6):
        exporting.submit(finished(trace_id))
    assert exporting.dropped == 6  # three traces of 3 spans fit in 9
    exporting.shutdown()
    assert sum(decoded for decoded, _ in sender.sent) == 9
    exporting.submit(finished(7))  # after shutdown: dropped, not queued forever
    assert exporting.dropped == 9


def test_the_sdks_http_exporter_sends_the_encoded_request() -> None:
    with otlp_receiver() as (url, received):
        sender = export.sender(grpc=False, endpoint=f"{url}/v1/traces")
        assert sender is not None
        try:
            assert sender.send(ENVELOPE(otlp.spans(finished(5))), 3)
        finally:
            sender.shutdown()
    assert received.paths == ["/v1/traces"]
    assert [span.name for span in received.spans()] == ["step0", "step1", "chat m"]  # type: ignore[attr-defined]


def posting_transport(endpoint: str) -> object:
    """The transport the OTLP/HTTP sender to ``endpoint`` posts with."""
    sender = export.sender(grpc=False, endpoint=endpoint)
    assert sender is not None
    try:
        return sender._client._transport  # type: ignore[attr-defined]
    finally:
        sender.shutdown()


def test_a_plain_http_endpoint_is_posted_to_without_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    endpoint = "http://127.0.0.1:4318/v1/traces"
    assert isinstance(export.lean_transport(endpoint), PlainHttpTransport)
    assert isinstance(posting_transport(endpoint), PlainHttpTransport)


@pytest.mark.parametrize(
    ("variable", "value", "endpoint"),
    [
        ("HTTP_PROXY", "http://proxy.example:3128", "http://collector.example:4318/v1/traces"),
        (
            "OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER",
            "a-provider",
            "http://127.0.0.1:4318/v1/traces",
        ),
        (None, None, "https://collector.example:4318/v1/traces"),
    ],
)
def test_a_proxy_a_credential_provider_or_tls_keeps_requests(
    monkeypatch: pytest.MonkeyPatch, variable: str | None, value: str | None, endpoint: str
) -> None:
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    if variable is not None and value is not None:
        monkeypatch.setenv(variable, value)
    assert export.lean_transport(endpoint) is None
    if variable is None or variable == "HTTP_PROXY":  # no provider to load: it would fail
        assert isinstance(posting_transport(endpoint), RequestsHTTPTransport)


@contextmanager
def grpc_receiver() -> Iterator[tuple[str, list[ExportTraceServiceRequest]]]:
    received: list[ExportTraceServiceRequest] = []

    class Collector(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: ExportTraceServiceRequest, context: Any) -> Any:
            received.append(request)
            return ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Collector(), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        server.stop(None)


def test_the_sdks_grpc_exporter_sends_the_encoded_request() -> None:
    with grpc_receiver() as (url, received):
        sender = export.sender(grpc=True, endpoint=url)
        assert sender is not None
        try:
            assert sender.send(ENVELOPE(otlp.spans(finished(5, spans=4))), 4)
        finally:
            sender.shutdown()
    (request,) = received
    spans = request.resource_spans[0].scope_spans[0].spans
    assert [span.name for span in spans] == ["step0", "step1", "step2", "chat m"]
    assert request.resource_spans[0].scope_spans[0].scope.name == SCOPE.name


def test_each_exporter_named_gets_its_sink() -> None:
    environ = {"OTEL_TRACES_EXPORTER": "otlp,console", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    sinks = tracing.sinks_for(environ, TracerProvider())
    try:
        assert [type(sink) for sink in sinks] == [export.OtlpExport, ToSpanProcessor]
    finally:
        for sink in sinks:
            sink.shutdown()
