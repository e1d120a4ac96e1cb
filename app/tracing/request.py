"""One request's spans: :class:`RequestTrace`, started as the request arrives
(:func:`start`), current (``contextvars``) for the request's lifetime, ended once the request
is settled.

The tree (docs/operations.md, "Traces")::

    chat {model}                   the request (SERVER), under an incoming traceparent
    ├── authentication             app/overhead.py's phases, from its hook (:class:`PhaseSpans`)
    ├── resolution
    ├── preparation
    │   └── quota.reserve          the reservation's round trip to the quota backend
    ├── admission                  the wait for an engine slot
    ├── engine                     from the slot to the run's end; vLLM's llm_request under it
    │   ├── engine.first_token     ... up to the first token
    │   └── engine.rest            ... then the rest
    └── settlement

Nothing is recorded per streamed token: the engine's two children are made once the run has
ended, from the times it noted. With no tracer (:func:`use` ``None``), :func:`start` returns
``None`` and no other function here is reached on the request path.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import Token
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import context, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from app.errors import GatewayError

if TYPE_CHECKING:
    from app.overhead import Phase, RequestOverhead

PREFIX: Final = "lora_gateway."
OPERATION: Final = "gen_ai.operation.name"
REQUEST_MODEL: Final = "gen_ai.request.model"
RESPONSE_MODEL: Final = "gen_ai.response.model"
MAX_TOKENS: Final = "gen_ai.request.max_tokens"
INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
ERROR_TYPE: Final = "error.type"
STATUS_CODE: Final = "http.response.status_code"
REQUEST_ID: Final = PREFIX + "request_id"
TENANT: Final = PREFIX + "tenant.id"
KEY: Final = PREFIX + "key.id"
ADAPTER: Final = PREFIX + "adapter.name"
ADAPTER_VERSION: Final = PREFIX + "adapter.version"
PRIORITY: Final = PREFIX + "priority"
QUEUE_WAIT_MS: Final = PREFIX + "queue_wait_ms"
STREAM: Final = PREFIX + "stream"
OUTCOME: Final = PREFIX + "outcome"

QUOTA: Final = "quota.reserve"
ADMISSION: Final = "admission"
ENGINE: Final = "engine"
FIRST_TOKEN: Final = "engine.first_token"
REST: Final = "engine.rest"
SETTLEMENT: Final = "settlement"

OPERATIONS: Final = {
    "chat.completions": "chat",
    "completions": "text_completion",
    "responses": "chat",
}
"""The GenAI operation name of each endpoint."""

TRACE_HEADERS: Final = (b"traceparent", b"tracestate")
_propagator = TraceContextTextMapPropagator()
_tracer: Tracer | None = None


def use(tracer: Tracer | None) -> None:
    """Trace requests with ``tracer`` from now on (``None``: none)."""
    global _tracer
    _tracer = tracer


def tracer() -> Tracer | None:
    return _tracer


def start(
    overhead: RequestOverhead,
    headers: Sequence[tuple[bytes, bytes]],
    endpoint: str,
    request_id: str | None,
) -> RequestTrace | None:
    """The trace of a request to ``endpoint`` (an ``OPERATIONS`` key) that arrived with
    ``headers`` (ASGI's), under their ``traceparent`` where they carry one; ``None`` when
    tracing is off. Its phases are traced through ``overhead``."""
    tracer = _tracer
    if tracer is None:
        return None
    carrier = {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in headers
        if name in TRACE_HEADERS
    }
    parent = _propagator.extract(carrier) if carrier else None
    operation = OPERATIONS.get(endpoint, endpoint)
    attributes: dict[str, Any] = {OPERATION: operation}
    if request_id is not None:
        attributes[REQUEST_ID] = request_id
    root = tracer.start_span(operation, parent, SpanKind.SERVER, attributes)
    request = RequestTrace(tracer, root, operation)
    overhead.trace = request
    return request


def of(overhead: RequestOverhead | None) -> RequestTrace | None:
    """The trace ``overhead``'s request carries, if any."""
    if overhead is None:
        return None
    request: RequestTrace | None = overhead.trace
    return request


def step(
    request: RequestTrace | None, name: str, under: str | None = None
) -> AbstractContextManager[Any]:
    """A child span ``name`` (under the open span ``under``, else the request's) around a
    ``with`` block; nothing when ``request`` is ``None``."""
    if request is None:
        return nullcontext()
    return request.step(name, under)


def error_type(failure: BaseException) -> str:
    """``error.type`` for ``failure``: the gateway's error code (or type), else the
    exception's class."""
    if isinstance(failure, GatewayError):
        return failure.code or failure.error_type
    return type(failure).__qualname__


def _epoch_ns(monotonic: float) -> int:
    """``time.monotonic`` reading ``monotonic``, as a span's time (ns since the epoch)."""
    return time.time_ns() - int((time.monotonic() - monotonic) * 1e9)


class RequestTrace:
    """One request's spans: the request's own (``root``) and its open children by name."""

    __slots__ = (
        "_closing",
        "_context",
        "_engine_began",
        "_failed",
        "_open",
        "_operation",
        "_settling",
        "_tracer",
        "root",
    )

    def __init__(self, tracer: Tracer, root: Span, operation: str) -> None:
        self._tracer = tracer
        self.root = root
        self._operation = operation
        self._context = trace.set_span_in_context(root)
        self._open: dict[str, Span] = {}
        self._closing = self._settling = self._failed = False
        self._engine_began = 0.0

    @property
    def trace_id(self) -> str:
        """The request's trace id, 32 hex digits (as the access log and the logs name it)."""
        return format(self.root.get_span_context().trace_id, "032x")

    def attach(self) -> Token[Context]:
        """Make the request's span current in this context; the token to :meth:`detach`."""
        return context.attach(self._context)

    @staticmethod
    def detach(token: Token[Context]) -> None:
        context.detach(token)

    def begin(self, name: str, under: str | None = None) -> Span:
        """Open the child span ``name``, under the open span ``under`` or the request's."""
        parent = self._open.get(under) if under is not None else None
        parent_context = self._context if parent is None else trace.set_span_in_context(parent)
        span = self._tracer.start_span(name, parent_context)
        self._open[name] = span
        return span

    def end(self, name: str, failure: BaseException | None = None) -> None:
        """Close the child span ``name`` (failed by ``failure``, where given)."""
        span = self._open.pop(name, None)
        if span is None:
            return
        if failure is not None:
            _fail(span, failure)
        span.end()
        if name == SETTLEMENT:
            self._settling = False
            if self._closing:
                self._end_all()

    @contextmanager
    def step(self, name: str, under: str | None = None) -> Iterator[None]:
        self.begin(name, under)
        try:
            yield
        except BaseException as exc:
            self.end(name, exc)
            raise
        self.end(name)

    def identified(
        self, tenant: str, key: str, model: str, max_tokens: int | None, stream: bool
    ) -> None:
        """Who asked for what: the tenant and key ids, the model as called, the completion
        limit asked and whether the answer streams."""
        self.root.update_name(f"{self._operation} {model}")
        attributes: dict[str, Any] = {
            TENANT: tenant,
            KEY: key,
            REQUEST_MODEL: model,
            STREAM: stream,
        }
        if max_tokens is not None:
            attributes[MAX_TOKENS] = max_tokens
        self.root.set_attributes(attributes)

    def resolved(
        self, served: str, adapter: str | None, version: int | None, priority: str
    ) -> None:
        """What the model resolved to: the name it is served as, the adapter's global name and
        version (none for the base model), and the tenant's priority class."""
        attributes: dict[str, Any] = {RESPONSE_MODEL: served, PRIORITY: priority}
        if adapter is not None and version is not None:
            attributes[ADAPTER] = adapter
            attributes[ADAPTER_VERSION] = version
        self.root.set_attributes(attributes)

    def admitted(self, queue_wait: float) -> dict[str, str]:
        """The request took an engine slot after ``queue_wait`` seconds: the admission span
        ends and the engine's begins; the trace headers that put the engine's own spans under
        it (``traceparent``)."""
        self.end(ADMISSION)
        self.root.set_attribute(QUEUE_WAIT_MS, queue_wait * 1000)
        engine = self.begin(ENGINE)
        self._engine_began = time.monotonic()
        headers: dict[str, str] = {}
        _propagator.inject(headers, trace.set_span_in_context(engine))
        return headers

    def expect_settlement(self) -> None:
        """The request will be settled: its span ends once settlement has, even where the
        response's own end (:meth:`close`) comes first (the client left mid-way)."""
        self._settling = True

    def ran(
        self,
        first_token_at: float | None,
        last_token_at: float | None,
        finish_reason: str | None,
        outcome: str,
        failure: BaseException | None,
    ) -> None:
        """The run ended, with ``outcome`` (its first and last tokens' ``time.monotonic``
        times, as it saw them): the engine span ends, with its two children."""
        self.root.set_attribute(OUTCOME, outcome)
        if finish_reason is not None:
            self.root.set_attribute(FINISH_REASONS, (finish_reason,))
        engine = self._open.pop(ENGINE, None)
        if engine is not None:
            if first_token_at is not None:
                parent = trace.set_span_in_context(engine)
                first = _epoch_ns(first_token_at)
                last = _epoch_ns(last_token_at or time.monotonic())
                began = _epoch_ns(self._engine_began)
                self._tracer.start_span(FIRST_TOKEN, parent, start_time=began).end(first)
                self._tracer.start_span(REST, parent, start_time=first).end(max(first, last))
            if outcome == "error" and failure is not None:
                _fail(engine, failure)
            engine.end()
        if outcome == "error":
            self.failed(failure)

    def used(self, prompt_tokens: int, completion_tokens: int) -> None:
        """The tokens the request is charged, once its run is closed."""
        self.root.set_attributes({INPUT_TOKENS: prompt_tokens, OUTPUT_TOKENS: completion_tokens})

    def failed(self, failure: BaseException | None) -> None:
        """The request was refused or failed: its span, and the spans open in it, say so."""
        if self._failed:
            return
        self._failed = True
        for span in (self.root, *self._open.values()):
            _fail(span, failure)
        if isinstance(failure, GatewayError):
            self.root.set_attribute(STATUS_CODE, failure.status_code)

    def close(self) -> None:
        """The response has ended: every span ends, the request's last, unless the request
        is being settled (it ends then)."""
        self._closing = True
        if not self._settling:
            self._end_all()

    def _end_all(self) -> None:
        for span in reversed(self._open.values()):
            span.end()
        self._open.clear()
        self.root.end()


def _fail(span: Span, failure: BaseException | None) -> None:
    kind = error_type(failure) if failure is not None else "_OTHER"
    message = failure.message if isinstance(failure, GatewayError) else None
    span.set_status(Status(StatusCode.ERROR, message))
    span.set_attribute(ERROR_TYPE, kind)


class PhaseSpans:
    """app/overhead.py's hook: a child span for each phase of a traced request (``engine``,
    the gateway's own code around the engine in many pieces, is :meth:`RequestTrace.admitted`
    and :meth:`RequestTrace.ran`'s instead)."""

    def began(self, overhead: RequestOverhead, phase: Phase) -> None:
        request = overhead.trace
        if request is not None and phase != "engine":
            request.begin(phase)

    def ended(self, overhead: RequestOverhead, phase: Phase, seconds: float) -> None:
        request = overhead.trace
        if request is not None and phase != "engine":
            request.end(phase)
