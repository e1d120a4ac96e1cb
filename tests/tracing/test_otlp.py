"""The request traces' OTLP encoding (app/tracing/otlp.py) against the SDK's own encoder: the
same ``ExportTraceServiceRequest`` for the same spans, whatever their attributes' types, their
statuses and their parent."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import SpanContext, TraceFlags, TraceState
from opentelemetry.util.types import AttributeValue

from app.tracing import otlp
from app.tracing.records import SERVER, FinishedTrace, SpanRecord
from app.tracing.setup import SCOPE
from app.tracing.sinks import readable_spans

RESOURCE = Resource.create({"service.name": "gw-test", "deployment.environment": "test"})
ATTRIBUTES: dict[str, AttributeValue] = {
    "a.string": "tenant-a",
    "an.empty.string": "",
    "unicode": "modèle ✓",
    "a.bool": True,
    "a.false.bool": False,
    "an.int": 64,
    "a.zero": 0,
    "a.negative.int": -3,
    "a.large.int": 2**62,
    "a.float": 0.125,
    "strings": ("length", "stop"),
    "ints": (1, 2, 300),
    "a.long.string": "x" * 300,
}


def trace_of(*, remote: bool, failed: bool, state: TraceState | None) -> FinishedTrace:
    trace_id = 0x4BF92F3577B34DA6A3CE929D0E0E4736
    parent = SpanContext(trace_id, 0x00F067AA0BA902B7, True, TraceFlags(1)) if remote else None
    root = SpanRecord(
        "chat my-model",
        0x1111,
        parent.span_id if parent else 0,
        1_700_000_000_000_000_000,
        SERVER,
        dict(ATTRIBUTES),
    )
    root.end = root.start + 5_000_000
    child = SpanRecord("engine", 2**64 - 1, root.span_id, root.start + 10)
    child.end = root.start + 20
    grandchild = SpanRecord("engine.first_token", 0x2222, child.span_id, root.start + 11)
    if failed:
        root.failed, root.message = True, "The model `nope` does not exist."
        root.attributes = {**ATTRIBUTES, "error.type": "model_not_found"}
        child.failed, child.attributes = True, {"error.type": "RuntimeError"}
    return FinishedTrace.of(trace_id, state, parent, [root, child, grandchild])


@pytest.mark.parametrize(
    ("remote", "failed", "state"),
    [
        (False, False, None),
        (True, False, TraceState([("vendor", "value"), ("other", "x")])),
        (True, True, TraceState()),
        (False, True, None),
    ],
)
def test_the_encoding_is_the_sdks_message_for_the_same_spans(
    remote: bool, failed: bool, state: TraceState | None
) -> None:
    traces = [
        trace_of(remote=remote, failed=failed, state=state),
        trace_of(remote=False, failed=False, state=None),
    ]
    envelope = otlp.envelope(RESOURCE, SCOPE.name, SCOPE.version or "")
    ours = ExportTraceServiceRequest.FromString(
        envelope(b"".join(otlp.spans(finished) for finished in traces))
    )
    sdk_spans = [span for finished in traces for span in readable_spans(finished, RESOURCE, SCOPE)]
    assert ours == encode_spans(sdk_spans)
    assert len(ours.resource_spans[0].scope_spans[0].spans) == 6


def test_attributes_kept_once_encoded_are_the_same_bytes_again() -> None:
    first = otlp.attributes(b"\x4a", ATTRIBUTES)
    assert otlp.attributes(b"\x4a", ATTRIBUTES) == first
    # The same key and value under another field's tag is another encoding.
    assert otlp.attributes(b"\x0a", ATTRIBUTES) != first
    # True and 1 are equal as dictionary keys, not as attributes.
    assert otlp.attributes(b"\x4a", {"v": True}) != otlp.attributes(b"\x4a", {"v": 1})
