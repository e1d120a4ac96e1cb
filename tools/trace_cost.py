"""Tracing's own CPU per request, part by part, in one process: ``python -m tools.trace_cost``.

It makes the calls a traced streamed chat request makes into app/tracing, in the request
path's order, for ``--requests`` requests, and reads this thread's CPU time (not wall time)
around each part:

* recorded: the request path's part, sampled (the record, the sampler, the trace context),
  less what the same request's phases cost with tracing off;
* unsampled: the same, the sampler saying no;
* encoded: the export thread's encoding of those traces as OTLP (app/tracing/otlp.py);
* sent: posting them, in batches of ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` spans (512), with
  the SDK's OTLP/HTTP exporter to a receiver on loopback that decodes and drops them;
* for comparison, the SDK's way: the same tree made as SDK spans, and the SDK's encoder.

Each figure is the median of ``--rounds`` rounds. ``make gateway-cost --tracing`` measures the
whole gateway traced against untraced; on a shared machine its per-request figure moves by
more than this whole cost, which is why this one exists.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind

from app import tracing
from app.overhead import RequestOverhead
from app.tracing import export, names, otlp, request
from app.tracing.records import FinishedTrace
from app.tracing.setup import SCOPE
from tools.gateway_cost.spans import span_sink

HEADERS = [
    (b"host", b"127.0.0.1"),
    (b"content-type", b"application/json"),
    (b"authorization", b"Bearer sk-0123456789"),
    (b"content-length", b"120"),
]


class Kept:
    """A sink that keeps each finished trace, or lets it go (``keep``)."""

    def __init__(self, *, keep: bool) -> None:
        self.keep = keep
        self.traces: list[FinishedTrace] = []

    def submit(self, finished: FinishedTrace) -> None:
        if self.keep:
            self.traces.append(finished)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True

    def shutdown(self) -> None:
        return None


def one_request(number: int) -> None:
    """The calls a streamed chat request makes into app/tracing, in order."""
    overhead = RequestOverhead("all")
    trace = request.start(overhead, HEADERS, "chat.completions", f"req-{number:016x}")
    assert trace is not None
    token = trace.attach()
    overhead.begin("authentication")
    overhead.end("authentication")
    trace.identified("tenant-a", "key_0123456789abcdef", "notes", 64, True)
    overhead.begin("resolution")
    trace.resolved("notes@v3", "tenant-a/notes", 3, "interactive")
    overhead.end("resolution")
    overhead.begin("preparation")
    with tracing.step(trace, names.QUOTA, under="preparation"):
        pass
    overhead.end("preparation")
    trace.begin(names.ADMISSION)
    trace.admitted(0.0004 * (number % 7))
    now = time.monotonic()
    trace.expect_settlement()
    trace.ran(now - 0.01, now, "length", "ok", None)
    overhead.begin("settlement")
    trace.used(18 + number % 5, 64)
    overhead.end("settlement")
    trace.close()
    trace.detach(token)


def untraced_request() -> None:
    """What the same request does with tracing off: its phases' clock reads."""
    overhead = RequestOverhead("all")
    for phase in ("authentication", "resolution", "preparation", "settlement"):
        overhead.begin(phase)
        overhead.end(phase)


def sdk_request(tracer: Any, number: int) -> None:
    """The same tree as the SDK's spans (how app/tracing first made it)."""
    attributes = {names.OPERATION: "chat", names.REQUEST_ID: f"req-{number:016x}"}
    root = tracer.start_span("chat", kind=SpanKind.SERVER, attributes=attributes)
    parent = trace.set_span_in_context(root)
    root.update_name("chat notes")
    root.set_attributes(
        {
            names.TENANT: "tenant-a",
            names.KEY: "key_0123456789abcdef",
            names.REQUEST_MODEL: "notes",
            names.STREAM: True,
            names.MAX_TOKENS: 64,
        }
    )
    for name in ("authentication", "resolution"):
        tracer.start_span(name, parent).end()
    root.set_attributes(
        {
            names.RESPONSE_MODEL: "notes@v3",
            names.PRIORITY: "interactive",
            names.ADAPTER: "tenant-a/notes",
            names.ADAPTER_VERSION: 3,
        }
    )
    preparation = tracer.start_span("preparation", parent)
    tracer.start_span(names.QUOTA, trace.set_span_in_context(preparation)).end()
    preparation.end()
    tracer.start_span(names.ADMISSION, parent).end()
    root.set_attribute(names.QUEUE_WAIT_MS, 0.4)
    engine = tracer.start_span(names.ENGINE, parent)
    under_engine = trace.set_span_in_context(engine)
    tracer.start_span(names.FIRST_TOKEN, under_engine).end()
    tracer.start_span(names.REST, under_engine).end()
    engine.end()
    root.set_attributes({names.OUTCOME: "ok", names.FINISH_REASONS: ("length",)})
    tracer.start_span(names.SETTLEMENT, parent).end()
    root.set_attributes({names.INPUT_TOKENS: 18, names.OUTPUT_TOKENS: 64})
    root.end()


def each(request: Callable[[int], None], requests: int) -> None:
    for number in range(requests):
        request(number)


def cpu_us(work: Callable[[], object], requests: int) -> float:
    """This thread's CPU time for ``work``, per request, in µs."""
    began = time.thread_time()
    work()
    return (time.thread_time() - began) / requests * 1e6


def one_round(requests: int, url: str) -> dict[str, float]:
    off = cpu_us(lambda: each(lambda _: untraced_request(), requests), requests)
    # The request path's part with each trace let go at once (the export's queue holds a
    # batch's worth, not a round's), then the same requests again, kept, for the encoder.
    provider = TracerProvider()
    tracing.install(provider, [Kept(keep=False)])
    recorded = cpu_us(lambda: each(one_request, requests), requests)
    tracing.install(TracerProvider(sampler=ALWAYS_OFF), [Kept(keep=False)])
    unsampled = cpu_us(lambda: each(one_request, requests), requests)
    kept = Kept(keep=True)
    tracing.install(provider, [kept])
    for n in range(requests):
        one_request(n)
    tracing.install(None)
    traces = kept.traces
    envelope = otlp.envelope(provider.resource, SCOPE.name, SCOPE.version or "")
    batches: list[tuple[bytes, int]] = []

    def encode() -> None:
        for first in range(0, len(traces), 51):  # 510 spans: within a batch of 512
            chunk = traces[first : first + 51]
            body = envelope(b"".join(otlp.spans(finished) for finished in chunk))
            batches.append((body, sum(f.span_count for f in chunk)))

    encoded = cpu_us(encode, requests)
    sender = export.sender(grpc=False, endpoint=f"{url}/v1/traces")
    assert sender is not None
    went: list[bool] = []
    sent = cpu_us(lambda: went.extend(sender.send(b, spans) for b, spans in batches), requests)
    sender.shutdown()
    if not all(went):
        raise RuntimeError("the receiver refused a batch (it could not decode it?)")
    exporter = InMemorySpanExporter()
    sdk = TracerProvider(shutdown_on_exit=False)
    sdk.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = sdk.get_tracer("compare")
    sdk_spans = cpu_us(lambda: each(lambda n: sdk_request(tracer, n), requests), requests)
    finished = exporter.get_finished_spans()
    sdk_encoded = cpu_us(
        lambda: [
            encode_spans(finished[first : first + 510]).SerializePartialToString()
            for first in range(0, len(finished), 510)
        ],
        requests,
    )
    return {
        "recorded": recorded - off,
        "unsampled": unsampled - off,
        "encoded": encoded,
        "sent": sent,
        "sdk_spans": sdk_spans,
        "sdk_encoded": sdk_encoded,
    }


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    with span_sink() as sink:
        rounds = [one_round(args.requests, sink.url) for _ in range(args.rounds)]
    medians = {part: statistics.median(r[part] for r in rounds) for part in rounds[0]}
    ours = medians["recorded"] + medians["encoded"] + medians["sent"]
    print(f"CPU per request, median of {args.rounds} rounds of {args.requests} requests (µs):")
    print(f"  request path, sampled:   {medians['recorded']:7.1f}")
    print(f"  request path, unsampled: {medians['unsampled']:7.1f}")
    print(f"  OTLP encoding:           {medians['encoded']:7.1f}")
    print(f"  OTLP/HTTP posts:         {medians['sent']:7.1f}")
    print(f"  all of it, sampled:      {ours:7.1f}")
    print(f"  the SDK's spans:         {medians['sdk_spans']:7.1f}")
    print(f"  the SDK's encoder:       {medians['sdk_encoded']:7.1f}")
    return medians


if __name__ == "__main__":
    main()
