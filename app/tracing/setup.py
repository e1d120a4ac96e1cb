"""Whether tracing is on, from the standard ``OTEL_*`` variables, and the tracer it uses.

Tracing is on when ``OTEL_SDK_DISABLED`` is not ``true`` and either ``OTEL_TRACES_EXPORTER``
names an exporter (``otlp`` or ``console``; ``none`` turns it off) or, with that variable
unset, an OTLP endpoint is set (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_ENDPOINT``). Unlike the SDK's own default (``otlp`` to localhost), nothing
set means off: a deployment that never asked for traces sends none anywhere.

OTLP goes over ``http/protobuf`` (the default) or ``grpc``, as
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` (else ``OTEL_EXPORTER_OTLP_PROTOCOL``) says; the
sampler is the SDK's, from ``OTEL_TRACES_SAMPLER`` and ``OTEL_TRACES_SAMPLER_ARG`` (default:
parent-based, always on); the exporter's headers, timeout and certificates and the
resource's ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` are read by the SDK as
usual, the batch processor's ``OTEL_BSP_*`` by it and by :mod:`app.tracing.export`. A value
the gateway cannot honour (``http/json``, an unknown exporter) stops it at start, named.

Two paths leave the process: vLLM's own spans of in-process requests go through the SDK's
tracer provider (:func:`provider_for`, global), the gateway's request traces through
:func:`sinks_for`'s sinks (OTLP encoded and sent from a thread of their own:
:mod:`app.tracing.export`), sampled by the same sampler. Off, neither exists and the request
path makes no OpenTelemetry call at all.
"""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Mapping, Sequence

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from app import __version__, overhead
from app.tracing import export, otlp, request
from app.tracing.sinks import Sink, ToSpanProcessor

logger = logging.getLogger(__name__)

SERVICE_NAME = "lora-gateway"
INSTRUMENTATION = "lora_gateway"
EXPORTERS = frozenset({"otlp", "console"})
PROTOCOLS = frozenset({"http/protobuf", "grpc"})
DEFAULT_HTTP_ENDPOINT = "http://localhost:4318"
DEFAULT_GRPC_ENDPOINT = "http://localhost:4317"

SCOPE = InstrumentationScope(INSTRUMENTATION, __version__)

_provider: TracerProvider | None = None


class TracingConfigError(ValueError):
    """An ``OTEL_*`` value the gateway cannot honour."""


def exporters(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The exporters ``environ`` asks for; empty: tracing is off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    named = environ.get("OTEL_TRACES_EXPORTER", "")
    names = [name.strip().lower() for name in named.split(",") if name.strip()]
    if not names:
        endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        return ["otlp"] if endpoint else []
    if "none" in names:
        return []
    unknown = sorted(set(names) - EXPORTERS)
    if unknown:
        raise TracingConfigError(
            f"OTEL_TRACES_EXPORTER={named!r}: the gateway exports traces with "
            f"{', '.join(sorted(EXPORTERS))} or none, not {', '.join(unknown)}."
        )
    return names


def protocol(environ: Mapping[str, str] = os.environ) -> str:
    """The OTLP protocol ``environ`` asks for (``http/protobuf`` unless it says ``grpc``)."""
    named = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if named not in PROTOCOLS:
        raise TracingConfigError(
            f"OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL={named!r}: the gateway exports OTLP over "
            "http/protobuf or grpc."
        )
    return named


def traces_endpoint(environ: Mapping[str, str] = os.environ) -> str | None:
    """Where OTLP traces go for ``environ`` (the whole URL, ``/v1/traces`` included, over
    HTTP), as the SDK's exporters work it out; ``None`` when no OTLP exporter is on. vLLM's
    own exporter is given this (it takes one endpoint, not the variables)."""
    if "otlp" not in exporters(environ):
        return None
    over_grpc = protocol(environ) == "grpc"
    if endpoint := environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return endpoint
    if endpoint := environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return endpoint if over_grpc else f"{endpoint.rstrip('/')}/v1/traces"
    return DEFAULT_GRPC_ENDPOINT if over_grpc else f"{DEFAULT_HTTP_ENDPOINT}/v1/traces"


def _exporter(name: str, environ: Mapping[str, str]) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    endpoint = traces_endpoint(environ)
    if protocol(environ) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter(endpoint=endpoint)


def resource(environ: Mapping[str, str] = os.environ) -> Resource:
    """The SDK's resource (``OTEL_RESOURCE_ATTRIBUTES``), named by ``OTEL_SERVICE_NAME``,
    else ``lora-gateway`` where nothing names the service."""
    detected = Resource.create({"service.version": __version__})
    name = environ.get("OTEL_SERVICE_NAME")
    if name is None and str(detected.attributes.get("service.name", "")).startswith(
        "unknown_service"
    ):
        name = SERVICE_NAME
    return detected if name is None else detected.merge(Resource({"service.name": name}))


def configure(environ: Mapping[str, str] = os.environ) -> bool:
    """Turn tracing on where ``environ`` asks for it (once per process: the first app that
    starts builds the tracer, the others share it); whether it is on. Where no other tracer
    provider is global yet, this one becomes it: vLLM's span of an in-process request is then
    exported too, sampled by the same sampler."""
    global _provider
    if _provider is not None:
        return True
    provider = provider_for(environ)
    if provider is None:
        return request.current() is not None
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)
    _provider = provider
    sinks = sinks_for(environ, provider)
    install(provider, sinks)
    for sink in sinks:
        atexit.register(sink.shutdown)  # what is queued is exported, as the provider's is
    logger.info(
        "tracing on: %s (OTLP to %s)", ", ".join(exporters(environ)), traces_endpoint(environ)
    )
    return True


def provider_for(environ: Mapping[str, str]) -> TracerProvider | None:
    """A tracer provider exporting as ``environ`` asks (a batch processor per exporter, the
    SDK's sampler); ``None`` when it leaves tracing off."""
    names = exporters(environ)
    if not names:
        return None
    provider = TracerProvider(resource=resource(environ))
    for name in names:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name, environ)))
    return provider


def sinks_for(environ: Mapping[str, str], provider: TracerProvider) -> list[Sink]:
    """Where the request traces go, for each exporter ``environ`` names: OTLP from
    :class:`~app.tracing.export.OtlpExport`, the console through the SDK's batch processor
    (and OTLP too where the installed exporter is not built as
    :func:`app.tracing.export.sender` expects)."""
    sinks: list[Sink] = []
    for name in exporters(environ):
        send = None
        if name == "otlp":
            grpc = protocol(environ) == "grpc"
            send = export.sender(grpc, traces_endpoint(environ))
        if send is not None:
            envelope = otlp.envelope(provider.resource, SCOPE.name, SCOPE.version or "")
            sinks.append(export.OtlpExport(send, envelope, environ))
        else:
            processor = BatchSpanProcessor(_exporter(name, environ))
            sinks.append(to_processor(processor, provider))
    return sinks


def to_processor(processor: SpanProcessor, provider: TracerProvider) -> Sink:
    """Request traces as the SDK's spans (of ``provider``'s resource) to ``processor``."""
    return ToSpanProcessor(processor, provider.resource, SCOPE)


def install(provider: TracerProvider | None, sinks: Sequence[Sink] = ()) -> None:
    """Trace every request with ``provider``'s sampler and ids from now on, into ``sinks``
    (``None``: tracing off). :func:`configure` calls it; tests give an SDK provider and an
    in-memory exporter's processor (:func:`to_processor`)."""
    if provider is None:
        request.use(None)
        overhead.set_hook(None)
        return
    request.use(request.RequestTracing(provider.sampler, provider.id_generator, sinks))
    overhead.set_hook(request.PhaseSpans())
