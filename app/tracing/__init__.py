"""OpenTelemetry traces of the gateway's requests: off unless the standard ``OTEL_*``
variables turn them on (:mod:`app.tracing.setup`); one span per request with a child for
each of its steps (:mod:`app.tracing.request`), recorded as plain data and exported in one
piece once the request has ended (:mod:`app.tracing.sinks`). docs/operations.md, "Traces"."""

from app.tracing.request import RequestTrace, of, start, step
from app.tracing.setup import (
    TracingConfigError,
    configure,
    exporters,
    install,
    protocol,
    sinks_for,
    to_processor,
    traces_endpoint,
)

__all__ = [
    "RequestTrace",
    "TracingConfigError",
    "configure",
    "exporters",
    "install",
    "of",
    "protocol",
    "sinks_for",
    "start",
    "step",
    "to_processor",
    "traces_endpoint",
]
