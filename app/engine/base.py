"""The narrow engine interface the serving code depends on."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from vllm import RequestOutput, SamplingParams

from app.tenancy.adapters import Adapter


class AdapterLoadFailed(Exception):
    """The engine could not load the request's adapter and ended the request; the message is
    the engine's reason. The engine serves on."""


class Engine(Protocol):
    max_model_len: int

    @property
    def tokenizer(self) -> Any:
        """A Hugging Face tokenizer (``encode``, ``decode``, ``apply_chat_template``)."""

    def generate(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        request_id: str,
        adapter: Adapter | None,
        cache_salt: str | None = None,
        on_abandoned: Callable[[RequestOutput], None] | None = None,
        trace_headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream outputs of one request (deltas), as the engine hands them over: with a
        ``stream_interval`` of N, the first token, then every N, and the last.

        Closing the iterator before the request ends, or cancelling a read, aborts it: the
        abort's last output, which carries what the request produced and the stream had not
        handed out (tokens held back for the next chunk, outputs not read yet), goes to
        ``on_abandoned`` before the close returns.

        Requests share prefix-cache entries only when their ``cache_salt``
        is equal (and their adapter version too). :class:`AdapterLoadFailed` when the
        adapter failed to load, before any output. ``trace_headers`` (``traceparent``): the
        span the engine's own span of the request goes under, where it traces requests.
        """

    async def abort(self, request_id: str) -> None:
        """End a running request early: its stream yields one last output, carrying what it
        produced and had not handed out yet, then ends."""

    async def remove_adapter(self, adapter: Adapter) -> None:
        """Free the adapter's device slot and host cache entry."""

    async def check_health(self) -> None:
        """Raise :class:`app.errors.EngineUnavailableError` if the engine is dead."""

    def num_unfinished_requests(self) -> int: ...


@dataclass(frozen=True)
class EngineLoad:
    """The engine scheduler's latest report on itself; vLLM makes one every step."""

    # Requests in the running batch.
    running: int
    # Requests queued inside the engine, not yet scheduled: served first come, first served.
    waiting: int
    # Share of the KV cache in use, 0 to 1.
    kv_cache_usage: float
    # Counts the reports: a new value is a new observation.
    step: int


@runtime_checkable
class ReportsLoad(Protocol):
    """An engine that tells its running batch from its own queue (the in-process ones; a
    remote engine does not), which the admission window follows."""

    def load(self) -> EngineLoad | None:
        """The latest report; ``None`` before the engine's first step."""
