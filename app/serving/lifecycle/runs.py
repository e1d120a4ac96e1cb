"""What the lifecycle knows of a request while it runs: a :class:`Run` (its answer, token
counts, timing and end), started by an endpoint's :class:`Service`; the in-process engine's
``EngineRun`` and the front's ``UpstreamRun`` are the two kinds."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel

from app.errors import GatewayError
from app.protocol import SamplingFields
from app.quota import Reservation
from app.serving.preparation.generation import Generation
from app.tenancy.tenants import ModelTarget, Principal
from app.usage import Fault

ADAPTER_VERSION_HEADER = "x-adapter-version"
"""The adapter version a response was served with (``model`` stays the alias called)."""

Request = TypeVar("Request", bound=SamplingFields)
RequestContra = TypeVar("RequestContra", bound=SamplingFields, contravariant=True)
Outcome = Literal["ok", "cancelled", "error"]


class ClientDisconnected(Exception):
    """The client left before its response was complete."""


def fault_of(failure: BaseException) -> Fault:
    """Whose doing ``failure`` is: the request's where the engine or the upstream refused
    what it asks (a 4xx), else the version's (the engine, the adapter's load or the upstream
    failed it)."""
    if isinstance(failure, GatewayError) and failure.status_code < 500:
        return "request"
    return "version"


class Run(Protocol):
    """One admitted request, running. The service that started it reads its answer; the
    tracker closes it, then settles with its token counts."""

    generation: Generation
    reservation: Reservation | None
    gateway_seconds: float
    """Wall time spent on its outputs in the gateway's own code: from each one's arrival to
    its answer written (app/overhead.py's ``engine`` phase)."""

    @property
    def headers(self) -> dict[str, str]:
        """The response's headers (``x-ratelimit-*``, the adapter version)."""

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens to charge."""

    @property
    def completion_tokens(self) -> int:
        """Completion tokens to charge: what was produced, as far as it is known once
        :meth:`close` has returned."""

    def outcome(self) -> Outcome:
        """``ok`` when the answer was complete, ``error`` when it failed, else ``cancelled``."""

    trace_headers: dict[str, str] | None
    """The trace context (``traceparent``) the engine's own spans go under, once admitted
    where the request is traced (app/tracing)."""

    @property
    def fault(self) -> Fault | None:
        """Whose doing its failure was, once it failed (:func:`fault_of`)."""

    @property
    def failure(self) -> BaseException | None:
        """What it failed with, where known."""

    @property
    def timing(self) -> RunTiming:
        """When its first and last tokens came, and why it ended, as far as it was seen."""

    def when_ended(self, callback: Callable[[], None]) -> None:
        """Have ``callback`` called once, as the request's last output arrives with its
        token counts, while the answer may still be on its way to the client. A run whose
        end is not its to see (another tier runs it) never calls it."""

    def when_first_token(self, callback: Callable[[], None]) -> None:
        """Have ``callback`` called once, as the request's first token arrives: it no longer
        waits inside the engine (for its queue, a device slot or its prompt's step). Never
        called for a request that ends with none."""

    async def close(self) -> None:
        """Stop whatever still runs for the request and count what it produced."""


@dataclass
class RunTiming:
    """What a run saw of its tokens' timing (``time.monotonic``) and its end: the ledger's
    TTFT, inter-token latency and finish reason, which compare an alias's versions."""

    first_token_at: float | None = None
    last_token_at: float | None = None
    finish_reason: str | None = None
    """The first choice's (``stop``, ``length``, ``tool_calls``...)."""
    on_first_token: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    """Called once, as the first token is seen (:meth:`Run.when_first_token`)."""

    def token_seen(self, now: float) -> None:
        if self.first_token_at is None:
            self.first_token_at = now
            first, self.on_first_token = self.on_first_token, None
            if first is not None:
                first()
        self.last_token_at = now

    def usage_fields(self, began: float, completion_tokens: int) -> dict[str, Any]:
        """The usage record's finish reason, TTFT (from ``began``) and mean inter-token
        latency."""
        first, last = self.first_token_at, self.last_token_at
        gaps = completion_tokens - 1
        return {
            "finish_reason": self.finish_reason,
            "ttft_ms": None if first is None else round((first - began) * 1000),
            "itl_ms": (
                None if first is None or last is None or gaps < 1 else (last - first) * 1000 / gaps
            ),
        }


class RunBase:
    """What every :class:`Run` keeps alike: its generation and reservation, the response's
    headers, its timing, and how it ended (set ``finished``, or call :meth:`fail`, as it
    learns)."""

    def __init__(self, generation: Generation, reservation: Reservation | None) -> None:
        self.generation = generation
        self.reservation = reservation
        self.finished = False
        self.failed = False
        self.fault: Fault | None = None
        self.failure: BaseException | None = None
        self.timing = RunTiming()
        self.gateway_seconds = 0.0
        self.trace_headers: dict[str, str] | None = None

    def fail(self, fault: Fault, failure: BaseException | None = None) -> None:
        """It failed, by ``fault``'s doing, with ``failure`` where it is known (the first
        failure seen is the one that counts)."""
        if not self.failed:
            self.failed, self.fault, self.failure = True, fault, failure

    @property
    def headers(self) -> dict[str, str]:
        headers = dict(self.reservation.headers) if self.reservation is not None else {}
        adapter = self.generation.target.adapter
        if adapter is not None:
            headers[ADAPTER_VERSION_HEADER] = str(adapter.version)
        return headers

    def when_first_token(self, callback: Callable[[], None]) -> None:
        if self.timing.first_token_at is None:
            self.timing.on_first_token = callback

    def outcome(self) -> Outcome:
        if self.failed:
            return "error"
        return "ok" if self.finished else "cancelled"


RunT = TypeVar("RunT", bound=Run)


class Service(Protocol[RequestContra, RunT]):
    """An endpoint (chat, completions): how its requests are prepared, run and answered."""

    endpoint: str
    fails_before_streaming: bool
    """Whether :meth:`stream` raises a failure that comes before its first event (to be
    answered with the error's own status, the response not started until that event), rather
    than streaming every failure as an error event."""

    def prepare(
        self, request: RequestContra, principal: Principal, target: ModelTarget, request_id: str
    ) -> Generation:
        """Tokenise and build the sampling parameters (CPU work, run off the event loop)."""

    def start(
        self, request: RequestContra, generation: Generation, reservation: Reservation | None
    ) -> RunT:
        """The run of an admitted request; nothing is sent anywhere until it is read."""

    async def complete(self, request: RequestContra, run: RunT) -> BaseModel:
        """The whole response, once the request has finished."""

    def stream(self, request: RequestContra, run: RunT) -> AsyncIterator[str]:
        """The response as server-sent events, as it is produced."""
