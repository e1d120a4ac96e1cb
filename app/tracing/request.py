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

No OpenTelemetry span is made on the request path: the request's span is a
:class:`SpanRecord`, each child a row of its name, ids and times in one list
(:mod:`app.tracing.records`), and the request's trace goes to the sinks
(:mod:`app.tracing.sinks`) in one piece once it has ended. The sampler decides once, as the
request arrives, on its trace id; an unsampled request records nothing
(:class:`RequestTrace`'s methods do nothing but hand on its trace context). Nothing is
recorded per streamed token: the engine's two children are made once the run has ended,
from the times it noted. With tracing off (:func:`use` ``None``), :func:`start` returns
``None`` and no other function here is reached on the request path.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from contextvars import Token
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import context, trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, Sampler, StaticSampler
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from app.errors import GatewayError
from app.tracing import names
from app.tracing.records import SERVER, Failure, FinishedTrace, SpanRecord
from app.tracing.sinks import Sink

if TYPE_CHECKING:
    from app.overhead import Phase, RequestOverhead

TRACE_HEADERS: Final = (b"traceparent", b"tracestate")
_propagator = TraceContextTextMapPropagator()
_NOTHING: Final = nullcontext()


class RequestTracing:
    """How requests are traced: with the SDK's ``sampler`` and ``ids`` (a tracer
    provider's), each sampled request's trace going to ``sinks`` once it has ended."""

    __slots__ = ("decisions", "ids", "sampler", "sinks")

    def __init__(self, sampler: Sampler, ids: IdGenerator, sinks: Sequence[Sink]) -> None:
        self.sampler = sampler
        self.ids = ids
        self.sinks = tuple(sinks)
        self.decisions = static_decisions(sampler)
        """The sampler's decisions where they are fixed (:func:`static_decisions`), taken
        without calling it; ``None``: it is called."""

    def trace(
        self, name: str, parent: Context | None, attributes: dict[str, AttributeValue]
    ) -> RequestTrace:
        """A request's trace, its span named ``name`` with ``attributes``, under the span
        ``parent`` holds (an incoming ``traceparent``'s) where it is valid: the sampler
        decides here, for the whole trace, as it would for the request's span."""
        # The parent as the SDK's samplers read it: without one given, the current span.
        span = trace.get_current_span(parent).get_span_context()
        remote = span if parent is not None and span.is_valid else None
        trace_id = remote.trace_id if remote is not None else self.ids.generate_trace_id()
        decisions = self.decisions
        if decisions is not None:
            # What the SDK's ALWAYS_ON, ALWAYS_OFF or ParentBased over those would return.
            if span.is_valid:
                decision = decisions[1 + 2 * (not span.is_remote) + (not span.trace_flags.sampled)]
                trace_state: TraceState | None = span.trace_state
            else:
                decision, trace_state = decisions[0], None
            sampled_attributes = attributes
        else:
            sampling = self.sampler.should_sample(
                parent, trace_id, name, SpanKind.SERVER, attributes
            )
            decision, trace_state = sampling.decision, sampling.trace_state
            sampled_attributes = dict(sampling.attributes)
        span_id = self.ids.generate_span_id()
        if decision is not Decision.RECORD_AND_SAMPLE:
            return RequestTrace(self, trace_id, span_id, trace_state)
        return RecordedTrace(self, trace_id, span_id, trace_state, remote, name, sampled_attributes)


_DELEGATES: Final = (
    "_root",
    "_remote_parent_sampled",
    "_remote_parent_not_sampled",
    "_local_parent_sampled",
    "_local_parent_not_sampled",
)


def static_decisions(sampler: Sampler) -> tuple[Decision, ...] | None:
    """Where ``sampler`` decides without reading what it is asked about but its parent (the
    SDK's ``ALWAYS_ON`` and ``ALWAYS_OFF``, and ``ParentBased`` over those: the default and
    what ``OTEL_TRACES_SAMPLER``'s ``always_on``, ``always_off``, ``parentbased_always_on``
    and ``parentbased_always_off`` name), its decision for a trace with no parent, then under
    a remote parent sampled and not, then a local parent sampled and not; ``None`` for any
    other sampler (it is called for each request)."""
    if type(sampler) is ParentBased:
        delegates: list[object] = [getattr(sampler, name, None) for name in _DELEGATES]
    elif type(sampler) is StaticSampler:
        delegates = [sampler] * len(_DELEGATES)
    else:
        return None
    decisions = [getattr(delegate, "_decision", None) for delegate in delegates]
    if not all(
        type(delegate) is StaticSampler and isinstance(decision, Decision)
        for delegate, decision in zip(delegates, decisions, strict=True)
    ):
        return None
    return tuple(decision for decision in decisions if isinstance(decision, Decision))


_tracing: RequestTracing | None = None


def use(tracing: RequestTracing | None) -> None:
    """Trace requests as ``tracing`` says from now on (``None``: none)."""
    global _tracing
    _tracing = tracing


def current() -> RequestTracing | None:
    return _tracing


def start(
    overhead: RequestOverhead,
    headers: Sequence[tuple[bytes, bytes]],
    endpoint: str,
    request_id: str | None,
) -> RequestTrace | None:
    """The trace of a request to ``endpoint`` (a ``names.OPERATIONS`` key) that arrived with
    ``headers`` (ASGI's), under their ``traceparent`` where they carry one; ``None`` when
    tracing is off. Its phases are traced through ``overhead``."""
    tracing = _tracing
    if tracing is None:
        return None
    parent = None
    for name, _ in headers:
        if name in TRACE_HEADERS:  # rare: most requests come with no trace context
            carrier = {
                name.decode("latin-1"): value.decode("latin-1")
                for name, value in headers
                if name in TRACE_HEADERS
            }
            parent = _propagator.extract(carrier)
            break
    operation = names.OPERATIONS.get(endpoint, endpoint)
    attributes: dict[str, AttributeValue] = {names.OPERATION: operation}
    if request_id is not None:
        attributes[names.REQUEST_ID] = request_id
    request = tracing.trace(operation, parent, attributes)
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
        return _NOTHING
    return request.step(name, under)


def error_type(failure: BaseException) -> str:
    """``error.type`` for ``failure``: the gateway's error code (or type), else the
    exception's class."""
    if isinstance(failure, GatewayError):
        return failure.code or failure.error_type
    return type(failure).__qualname__


_FLAGS: Final = (TraceFlags(TraceFlags.DEFAULT), TraceFlags(TraceFlags.SAMPLED))
"""The trace flags of a request's span, by whether it is sampled."""


class _RequestSpan(NonRecordingSpan):
    """The request's span as the OpenTelemetry API sees it, current in the request: its
    :class:`SpanContext` is made only when something asks for it (most requests never do),
    so that a request in flight holds fewer objects for the garbage collector to follow."""

    def __init__(self, request: RequestTrace) -> None:  # its context is made when asked for
        self._request = request

    def get_span_context(self) -> SpanContext:
        return self._request.span_context()

    def __repr__(self) -> str:
        return f"_RequestSpan({self.get_span_context()!r})"


class RequestTrace:
    """A request's trace that is not sampled: its context (the request's span's, current in
    the request: :meth:`attach`, and the engine's, handed on: :meth:`admitted`) and nothing
    recorded; :class:`RecordedTrace` records what these methods are told."""

    __slots__ = ("_span_id", "_trace_id", "_trace_state", "_tracing")

    sampled = False

    def __init__(
        self,
        tracing: RequestTracing,
        trace_id: int,
        span_id: int,
        trace_state: TraceState | None,
    ) -> None:
        self._tracing = tracing
        self._trace_id = trace_id
        self._span_id = span_id
        self._trace_state = trace_state

    @property
    def trace_id(self) -> str:
        """The request's trace id, 32 hex digits (as the access log and the logs name it)."""
        return format(self._trace_id, "032x")

    def span_context(self) -> SpanContext:
        """The request's span's context."""
        flags = _FLAGS[self.sampled]
        return SpanContext(self._trace_id, self._span_id, False, flags, self._trace_state)

    def attach(self) -> Token[Context]:
        """Make the request's span current in this context; the token to :meth:`detach`."""
        return context.attach(trace.set_span_in_context(_RequestSpan(self)))

    @staticmethod
    def detach(token: Token[Context]) -> None:
        context.detach(token)

    def _headers(self, span_id: int) -> dict[str, str]:
        """The trace headers that put a span under ``span_id`` (``traceparent``)."""
        flags = "01" if self.sampled else "00"
        headers = {"traceparent": f"00-{self._trace_id:032x}-{span_id:016x}-{flags}"}
        if self._trace_state and (state := self._trace_state.to_header()):
            headers["tracestate"] = state
        return headers

    def begin(self, name: str, under: str | None = None) -> None:
        """Open the child span ``name``, under the open span ``under`` or the request's."""

    def end(self, name: str, failure: BaseException | None = None) -> None:
        """Close the child span ``name`` (failed by ``failure``, where given)."""

    def step(self, name: str, under: str | None = None) -> AbstractContextManager[Any]:
        """The child span ``name`` around a ``with`` block."""
        return _NOTHING

    def identified(
        self, tenant: str, key: str, model: str, max_tokens: int | None, stream: bool
    ) -> None:
        """Who asked for what: the tenant and key ids, the model as called, the completion
        limit asked and whether the answer streams."""

    def resolved(
        self, served: str, adapter: str | None, version: int | None, priority: str
    ) -> None:
        """What the model resolved to: the name it is served as, the adapter's global name and
        version (none for the base model), and the tenant's priority class."""

    def admitted(self, queue_wait: float) -> dict[str, str]:
        """The request took an engine slot after ``queue_wait`` seconds: the admission span
        ends and the engine's begins; the trace headers that put the engine's own spans under
        it (``traceparent``)."""
        return self._headers(self._tracing.ids.generate_span_id())

    def expect_settlement(self) -> None:
        """The request will be settled: its span ends once settlement has, even where the
        response's own end (:meth:`close`) comes first (the client left mid-way)."""

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

    def used(self, prompt_tokens: int, completion_tokens: int) -> None:
        """The tokens the request is charged, once its run is closed."""

    def failed(self, failure: BaseException | None) -> None:
        """The request was refused or failed: its span, and the spans open in it, say so."""

    def close(self) -> None:
        """The response has ended: every span ends, the request's last, unless the request
        is being settled (it ends then); the trace goes to the sinks."""


class RecordedTrace(RequestTrace):
    """A sampled request's trace: its own span a :class:`SpanRecord`, its children rows of one
    list (:data:`app.tracing.records.ROW`), handed to the sinks as one
    :class:`FinishedTrace` once the request has ended (nothing recorded after that)."""

    __slots__ = (
        "_attributes",
        "_children",
        "_closing",
        "_ended",
        "_engine_began",
        "_failed",
        "_failures",
        "_open",
        "_operation",
        "_remote",
        "_root",
        "_settling",
    )

    sampled = True

    def __init__(
        self,
        tracing: RequestTracing,
        trace_id: int,
        span_id: int,
        trace_state: TraceState | None,
        remote: SpanContext | None,
        operation: str,
        attributes: dict[str, AttributeValue],
    ) -> None:
        super().__init__(tracing, trace_id, span_id, trace_state)
        self._remote = remote
        self._operation = operation
        parent_id = remote.span_id if remote is not None else 0
        self._root = SpanRecord(operation, span_id, parent_id, time.time_ns(), SERVER, attributes)
        self._attributes = attributes
        self._children: list[Any] = []
        self._open: dict[str, int] = {}
        """The open children: where each one's row begins in ``_children``."""
        self._failures: dict[int, Failure] | None = None
        """How children failed, by where their rows begin."""
        self._closing = self._settling = self._failed = self._ended = False
        self._engine_began = 0.0

    def begin(self, name: str, under: str | None = None) -> None:
        if self._ended:
            return
        children = self._children
        parent = self._span_id
        if under is not None and (at := self._open.get(under)) is not None:
            parent = self._identify(at)
        self._open[name] = len(children)
        # Its span id is made as the trace is exported (FinishedTrace.identify), off the event
        # loop, unless a span is opened under it or its context is handed on first.
        children += (name, 0, parent, time.time_ns(), 0)

    def _identify(self, at: int) -> int:
        """The span id of the child whose row begins at ``at``, made now where it was not."""
        children = self._children
        span_id: int = children[at + 1]
        if not span_id:
            span_id = children[at + 1] = self._tracing.ids.generate_span_id()
        return span_id

    def end(self, name: str, failure: BaseException | None = None) -> None:
        at = self._open.pop(name, None)
        if at is None:
            return
        if failure is not None:
            self._fail_child(at, failure)
        self._children[at + 4] = time.time_ns()
        if name == names.SETTLEMENT:
            self._settling = False
            if self._closing:
                self._end_all()

    def step(self, name: str, under: str | None = None) -> AbstractContextManager[Any]:
        return _Step(self, name, under)

    def identified(
        self, tenant: str, key: str, model: str, max_tokens: int | None, stream: bool
    ) -> None:
        self._root.name = f"{self._operation} {model}"
        attributes = self._attributes
        attributes[names.TENANT] = tenant
        attributes[names.KEY] = key
        attributes[names.REQUEST_MODEL] = model
        attributes[names.STREAM] = stream
        if max_tokens is not None:
            attributes[names.MAX_TOKENS] = max_tokens

    def resolved(
        self, served: str, adapter: str | None, version: int | None, priority: str
    ) -> None:
        attributes = self._attributes
        attributes[names.RESPONSE_MODEL] = served
        attributes[names.PRIORITY] = priority
        if adapter is not None and version is not None:
            attributes[names.ADAPTER] = adapter
            attributes[names.ADAPTER_VERSION] = version

    def admitted(self, queue_wait: float) -> dict[str, str]:
        self.end(names.ADMISSION)
        self._attributes[names.QUEUE_WAIT_MS] = queue_wait * 1000
        self.begin(names.ENGINE)
        self._engine_began = time.monotonic()
        engine = self._open.get(names.ENGINE)
        if engine is None:
            return super().admitted(queue_wait)
        return self._headers(self._identify(engine))

    def expect_settlement(self) -> None:
        self._settling = True

    def ran(
        self,
        first_token_at: float | None,
        last_token_at: float | None,
        finish_reason: str | None,
        outcome: str,
        failure: BaseException | None,
    ) -> None:
        attributes = self._attributes
        attributes[names.OUTCOME] = outcome
        if finish_reason is not None:
            attributes[names.FINISH_REASONS] = (finish_reason,)
        engine = self._open.pop(names.ENGINE, None)
        if engine is not None:
            children = self._children
            if first_token_at is not None:
                # time.monotonic's readings as times since the epoch, as a span's are.
                offset = time.time_ns() - int(time.monotonic() * 1e9)
                began = int(self._engine_began * 1e9) + offset
                first = int(first_token_at * 1e9) + offset
                last = max(first, int((last_token_at or time.monotonic()) * 1e9) + offset)
                engine_id = self._identify(engine)
                children += (
                    *(names.FIRST_TOKEN, 0, engine_id, began, first),
                    *(names.REST, 0, engine_id, first, last),
                )
            if outcome == "error" and failure is not None:
                self._fail_child(engine, failure)
            children[engine + 4] = time.time_ns()
        if outcome == "error":
            self.failed(failure)

    def used(self, prompt_tokens: int, completion_tokens: int) -> None:
        attributes = self._attributes
        attributes[names.INPUT_TOKENS] = prompt_tokens
        attributes[names.OUTPUT_TOKENS] = completion_tokens

    def failed(self, failure: BaseException | None) -> None:
        if self._failed or self._ended:
            return
        self._failed = True
        _fail(self._root, failure)
        for at in self._open.values():
            self._fail_child(at, failure)
        if isinstance(failure, GatewayError):
            self._attributes[names.STATUS_CODE] = failure.status_code

    def _fail_child(self, at: int, failure: BaseException | None) -> None:
        if self._failures is None:
            self._failures = {}
        self._failures[at] = Failure(_message(failure), _error_type(failure))

    def close(self) -> None:
        self._closing = True
        if not self._settling:
            self._end_all()

    def _end_all(self) -> None:
        if self._ended:
            return
        self._ended = True
        now = time.time_ns()
        children = self._children
        for at in self._open.values():
            children[at + 4] = now
        self._open.clear()
        self._root.end = now
        finished = FinishedTrace(
            self._trace_id,
            self._trace_state,
            self._remote,
            self._root,
            children,
            self._failures,
            self._tracing.ids,
        )
        # The sinks have the spans now (the export's thread reads them): the trace, which may
        # live on with the request's objects, lets them go, and what it is told from now on
        # goes nowhere, as before it ended.
        self._children = []
        self._attributes = {}
        sinks = self._tracing.sinks
        if len(sinks) > 1:
            finished.identify()  # one set of ids, before sinks read it in threads of their own
        for sink in sinks:
            sink.submit(finished)


class _Step:
    """:meth:`RecordedTrace.step`'s span around a ``with`` block."""

    __slots__ = ("_name", "_trace", "_under")

    def __init__(self, request: RecordedTrace, name: str, under: str | None) -> None:
        self._trace = request
        self._name = name
        self._under = under

    def __enter__(self) -> None:
        self._trace.begin(self._name, self._under)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        failure: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._trace.end(self._name, failure)


def _message(failure: BaseException | None) -> str | None:
    return failure.message if isinstance(failure, GatewayError) else None


def _error_type(failure: BaseException | None) -> str:
    return error_type(failure) if failure is not None else "_OTHER"


def _fail(span: SpanRecord, failure: BaseException | None) -> None:
    span.failed = True
    span.message = _message(failure)
    if span.attributes is None:
        span.attributes = {names.ERROR_TYPE: _error_type(failure)}
    else:
        span.attributes[names.ERROR_TYPE] = _error_type(failure)


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
