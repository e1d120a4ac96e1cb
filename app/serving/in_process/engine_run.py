"""A request run on the engine inside this process."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from vllm import RequestOutput

from app.engine.base import AdapterLoadFailed, Engine
from app.errors import AdapterUnservableError, GenerationFailedError
from app.overhead import clock
from app.quota import Reservation
from app.serving.in_process.token_meter import TokenMeter
from app.serving.lifecycle.runs import RunBase, fault_of
from app.serving.preparation.generation import Generation

logger = logging.getLogger(__name__)

DRAIN_SECONDS = 2.0
"""How long an aborted request's last output may take to arrive through a stream still open:
it carries the tokens the engine produced that the client had not read yet (those a stream
interval held back included), which are charged too."""


class EngineRun(RunBase):
    """One admitted request on the in-process engine. :meth:`outputs` opens its engine
    stream (once); the tracker closes it."""

    def __init__(
        self, engine: Engine, generation: Generation, reservation: Reservation | None
    ) -> None:
        super().__init__(generation, reservation)
        tenant = generation.principal.tenant.id
        self.meter = TokenMeter(tenant, generation.target.model)
        self._engine = engine
        self._stream: AsyncIterator[RequestOutput] | None = None
        self._ended: Callable[[], None] | None = None

    @property
    def prompt_tokens(self) -> int:
        return self.generation.prompt_tokens

    @property
    def completion_tokens(self) -> int:
        return self.meter.completion_tokens

    async def outputs(self) -> AsyncIterator[RequestOutput]:
        """The engine's deltas, as it produces them."""
        if self._stream is not None:
            raise RuntimeError("a request's engine stream is read once")
        generation = self.generation
        self._stream = self._engine.generate(
            generation.prompt_token_ids,
            generation.params,
            generation.request_id,
            generation.target.adapter,
            # A tenant's cached prefixes never serve another tenant (nor a later tenant of
            # the same id): no timing side channel reveals what others have asked.
            cache_salt=generation.principal.tenant.cache_salt,
            on_abandoned=self._abandoned,
            trace_headers=self.trace_headers,
        )
        try:
            async for output in self._stream:
                arrived = clock()
                if self._observe(output):
                    # As vLLM's own server: an end the engine calls an error is a 500, not
                    # "stop" (e.g. a grammar llguidance gave up on mid-way). The request's
                    # doing: a tenant must not fail its own split's version at will.
                    failure = GenerationFailedError(
                        "The engine ended this request with an error; what it produced "
                        "until then is charged."
                    )
                    self.fail("request", failure)
                    raise failure
                yield output
                # Back once the reader has answered with it, and asks for the next one.
                self.gateway_seconds += clock() - arrived
        except AdapterLoadFailed as exc:
            unservable = AdapterUnservableError(generation.target.model, str(exc))
            self.fail("version", unservable)
            raise unservable from exc
        except Exception as exc:
            self.fail(fault_of(exc), exc)
            raise

    def when_ended(self, callback: Callable[[], None]) -> None:
        self._ended = callback

    def _observe(self, output: RequestOutput) -> bool:
        """Count ``output``; whether the engine ended a choice of it with an error."""
        meter = self.meter
        if meter.observe(output):
            self.timing.token_seen(meter.last_token_at)  # type: ignore[arg-type]
        failed = False
        for choice in output.outputs:
            if choice.finish_reason == "error":
                failed = True
        if output.finished:
            self.finished = True
            if output.outputs:
                self.timing.finish_reason = output.outputs[0].finish_reason
            if self._ended is not None:
                ended, self._ended = self._ended, None
                ended()
        return failed

    def _abandoned(self, output: RequestOutput) -> None:
        """The last output of a request aborted as its stream was closed or a read of it
        cancelled (the client left): never handed out, its tokens are charged all the same.
        The request did not finish."""
        self.meter.observe(output)

    async def _drain(self, stream: AsyncIterator[RequestOutput]) -> None:
        async for output in stream:
            self._observe(output)

    async def close(self) -> None:
        """Abort an unfinished engine request, count what it produced until then, and close
        the stream. A stream the client's leaving closed has aborted it already, and counted
        its last output (:meth:`_abandoned`)."""
        stream = self._stream
        if stream is None:
            return
        try:
            if not self.finished and not self.failed:
                await self._engine.abort(self.generation.request_id)
                await asyncio.wait_for(self._drain(stream), DRAIN_SECONDS)
        except Exception:
            logger.warning(
                "could not drain aborted request %s", self.generation.request_id, exc_info=True
            )
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
