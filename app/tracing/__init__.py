"""OpenTelemetry traces of the gateway's requests: off unless the standard ``OTEL_*``
variables turn them on (:mod:`app.tracing.setup`); one span per request with a child for
each of its steps (:mod:`app.tracing.request`). docs/operations.md, "Traces"."""

from app.tracing.request import RequestTrace, of, start, step
from app.tracing.setup import (
    TracingConfigError,
    configure,
    exporters,
    install,
    protocol,
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
    "start",
    "step",
    "traces_endpoint",
]
