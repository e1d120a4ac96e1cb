"""Request traces to an OTLP collector: :class:`OtlpExport` queues each finished trace as it
ends, and its thread encodes (:mod:`app.tracing.otlp`) and sends a batch at a time with the
SDK's own OTLP exporter (:func:`sender`: its endpoint, headers, timeout, compression,
certificates and retries, from the same ``OTEL_EXPORTER_OTLP_*`` variables). Over HTTP to a
plain ``http://`` endpoint that no proxy variable, credential provider or ``.netrc`` entry
concerns, the exporter posts over one kept ``http.client`` connection
(:mod:`app.tracing.transport`) rather than with its default, requests, which reads the proxy
variables and ``.netrc`` again at every post (most of a post's CPU); otherwise with requests,
as the SDK does. The queue and the batches follow the batch span processor's ``OTEL_BSP_*``
variables, counted in spans as it counts them."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import NamedTuple, Protocol

import requests.utils
from opentelemetry.exporter.http.transport._base import BaseHTTPTransport
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpExporter,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.environment_variables import (
    _OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER,
    _OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER,
)
from opentelemetry.sdk.trace.export import SpanExportResult

from app.tracing import otlp
from app.tracing.records import FinishedTrace
from app.tracing.transport import PlainHttpTransport

logger = logging.getLogger(__name__)


class Sender(Protocol):
    """Sends one encoded ``ExportTraceServiceRequest`` of ``spans`` spans; whether it went."""

    def send(self, request: bytes, spans: int) -> bool: ...

    def shutdown(self) -> None: ...


class _Encoded(NamedTuple):
    request: bytes
    spans: int


class _HttpSender(HttpExporter):
    """The SDK's OTLP/HTTP exporter, given bytes already encoded."""

    def send(self, request: bytes, spans: int) -> bool:
        with self._metrics.export_operation(spans) as result:
            sent = self._client.export(request)
            if not sent.success:
                result.error = sent.error
                return False
        return True


class _GrpcSender(GrpcExporter):
    """The SDK's OTLP/gRPC exporter, given bytes already encoded (parsed back in C for the
    stub, which serialises a message)."""

    def _translate_data(self, data: _Encoded) -> ExportTraceServiceRequest:  # type: ignore[override]
        decoded: ExportTraceServiceRequest = ExportTraceServiceRequest.FromString(data.request)
        return decoded

    def _count_data(self, data: _Encoded) -> int:  # type: ignore[override]
        return data.spans

    def send(self, request: bytes, spans: int) -> bool:
        # The mixin's _export takes whatever _translate_data does.
        result = self._export(_Encoded(request, spans))  # type: ignore[arg-type]
        return result == SpanExportResult.SUCCESS


def lean_transport(endpoint: str) -> BaseHTTPTransport | None:
    """A transport over one kept ``http.client`` connection
    (:class:`~app.tracing.transport.PlainHttpTransport`) for posts to ``endpoint``, where the
    requests transport would do nothing more: a plain ``http://`` endpoint (no certificates),
    no proxy variable that applies to it, no credential provider (a requests session) and no
    ``.netrc`` entry for its host, in this process's environment (which the SDK's exporter
    reads); ``None`` otherwise."""
    credentials = (
        _OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER,
        _OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER,
    )
    if not endpoint.lower().startswith("http://") or any(os.environ.get(n) for n in credentials):
        return None
    if requests.utils.get_environ_proxies(endpoint) or requests.utils.get_netrc_auth(endpoint):
        return None
    return PlainHttpTransport()


def sender(grpc: bool, endpoint: str | None) -> Sender | None:
    """The SDK's OTLP exporter over gRPC or HTTP, to ``endpoint``, as a :class:`Sender`
    (over HTTP, with :func:`lean_transport` where there is one); ``None`` where the installed
    SDK's exporter is not built as this module expects (then the SDK's spans go through its
    own exporter instead)."""
    if grpc:
        exported = callable(getattr(GrpcExporter, "_export", None))
        return _GrpcSender(endpoint=endpoint) if exported else None
    transport = lean_transport(endpoint) if endpoint is not None else None
    http_sender = None
    if transport is not None:
        with contextlib.suppress(TypeError):  # an exporter that takes no transport
            http_sender = _HttpSender(endpoint=endpoint, _transport=transport)
    if http_sender is None:
        http_sender = _HttpSender(endpoint=endpoint)
    client = getattr(http_sender, "_client", None)
    if callable(getattr(client, "export", None)) and hasattr(http_sender, "_metrics"):
        return http_sender
    http_sender.shutdown()  # type: ignore[no-untyped-call]
    return None


def _setting(environ: Mapping[str, str], name: str, default: int) -> int:
    try:
        value = int(environ.get(name, default))
    except ValueError:
        logger.warning("%s is not a whole number: %s used", name, default)
        return default
    return value if value > 0 else default


class OtlpExport:
    """A :class:`~app.tracing.sinks.Sink` that queues each finished trace and
    exports the queue from a thread of its own, as the SDK's batch processor exports its
    spans: a full batch (``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` spans) as soon as one waits, the
    rest every ``OTEL_BSP_SCHEDULE_DELAY`` ms, everything on a flush and at shutdown; a trace
    that would take the queue past ``OTEL_BSP_MAX_QUEUE_SIZE`` spans is dropped (and
    counted), as the batch processor drops spans.

    The thread is woken once per full batch, not per trace, and a full batch is sent alone:
    what is left over waits for the next batch or the schedule, so that under load every post
    carries a whole batch (a post costs the same CPU whatever it carries)."""

    def __init__(
        self,
        send: Sender,
        envelope: Callable[[bytes], bytes],
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        self._sender = send
        self._envelope = envelope
        self._delay = _setting(environ, "OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000
        self._max_batch = _setting(environ, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)
        self._max_queue = _setting(environ, "OTEL_BSP_MAX_QUEUE_SIZE", 2048)
        self._queue: deque[FinishedTrace] = deque()
        self._queued = 0
        self.dropped = 0
        """Spans dropped because the queue was full."""
        self._lock = threading.Condition()
        self._flushes_asked = self._flushes_done = 0
        self._stopping = False
        self._due = time.monotonic() + self._delay
        """When the schedule sends what is queued, full batch or not."""
        self._thread = threading.Thread(target=self._work, name="otlp-request-traces", daemon=True)
        self._thread.start()

    @property
    def thread(self) -> threading.Thread:
        """The thread that exports (a measure reads its CPU clock)."""
        return self._thread

    def submit(self, finished: FinishedTrace) -> None:
        # Encoded in the thread, a batch at a time, not here on the event loop: the same code
        # run for fifty traces in a row costs a fraction of what it costs once between two
        # requests' work, and the loop's part of a request is only to queue it.
        spans = finished.span_count
        with self._lock:
            queued = self._queued
            if queued + spans > self._max_queue or self._stopping:
                if not self.dropped:
                    logger.warning("the trace export queue is full: spans dropped")
                self.dropped += spans
                return
            self._queue.append(finished)
            self._queued = queued + spans
            if queued < self._max_batch <= queued + spans:  # a batch has just filled
                self._lock.notify_all()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export everything queued; whether it was done within ``timeout_millis``."""
        with self._lock:
            self._flushes_asked += 1
            asked = self._flushes_asked
            self._lock.notify_all()
            return self._lock.wait_for(
                lambda: self._flushes_done >= asked or not self._thread.is_alive(),
                timeout_millis / 1000,
            )

    def shutdown(self) -> None:
        """Export what is queued and stop (what comes after is dropped)."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            self._lock.notify_all()
        self._thread.join()
        self._sender.shutdown()

    def _work(self) -> None:
        while True:
            with self._lock:
                while self._waits():
                    self._lock.wait(max(0.0, self._due - time.monotonic()))
                stopping, asked = self._stopping, self._flushes_asked
                everything = stopping or asked != self._flushes_done or self._is_due()
                if everything:
                    self._due = time.monotonic() + self._delay
                batches = self._take(everything)
            for traces, spans in batches:
                self._send(traces, spans)
            del batches
            if everything:
                with self._lock:
                    self._flushes_done = asked
                    self._lock.notify_all()
            if stopping:
                return

    def _is_due(self) -> bool:
        return time.monotonic() >= self._due

    def _waits(self) -> bool:
        return (
            not self._stopping
            and self._queued < self._max_batch
            and self._flushes_done == self._flushes_asked
            and not self._is_due()
        )

    def _take(self, everything: bool) -> list[tuple[list[FinishedTrace], int]]:
        """The queued traces to send now (all of them, or the full batches), as requests of
        at most the batch size (a trace is never split: one larger than the batch size goes
        alone); called with the lock held."""
        batches: list[tuple[list[FinishedTrace], int]] = []
        queue, max_batch = self._queue, self._max_batch
        while queue and (everything or self._queued >= max_batch):
            traces: list[FinishedTrace] = []
            spans = 0
            while queue and (not traces or spans + queue[0].span_count <= max_batch):
                finished = queue.popleft()
                traces.append(finished)
                spans += finished.span_count
            self._queued -= spans
            batches.append((traces, spans))
        return batches

    def _send(self, traces: list[FinishedTrace], spans: int) -> None:
        try:
            encoded = self._envelope(b"".join([otlp.spans(finished) for finished in traces]))
            traces.clear()  # let them go before the post's wait
            self._sender.send(encoded, spans)
        except Exception:  # the thread goes on: the next batch may go
            logger.exception("exporting %d spans failed", spans)
