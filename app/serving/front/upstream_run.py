"""A request run on the upstream (the front role): one HTTP exchange, and what it produced.

What is charged, however the request ends:

- the upstream's own ``usage`` when it sent one: the whole answer's, or, for a stream cut
  short, the last counts it streamed (the front always asks for ``continuous_usage_stats``:
  each chunk says how many tokens its choice has produced so far);
- a streamed request with no counts yet (the client left before the first chunk): the prompt,
  with no completion tokens, as the upstream produced none it sent;
- a stream the client cut short whose chunks gather ``stream_interval`` tokens: the last
  counts plus that many less one per unfinished choice (within the completion budget), the
  most the upstream may have produced and not yet sent (a choice's last chunk goes at
  once). Its abort's last counts never reach the front, and a count short of them would
  make part of every abandoned stream free;
- a non-streamed request the client abandoned: the worst case it reserved. The upstream
  counts only in its final answer, which never comes once the connection is closed, and a
  count of zero would make a long generation free to anyone who hangs up just before its
  end. Streaming upstream internally would know the count, but would mean rebuilding the
  whole answer (choices, tool calls, logprobs) from chunks in the front: more code for a case
  the client chose;
- a failed request (unreachable, timed out, an error answer): what the upstream counted
  before it failed, else the prompt alone. The failure is the deployment's, not the client's.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from pydantic import ValidationError

from app import metrics
from app.errors import GatewayError, UpstreamError
from app.overhead import clock
from app.protocol import ChatCompletion, ChatCompletionChunk, Completion
from app.quota import Reservation
from app.serving.front.http1 import Response, TransportError
from app.serving.front.relay import ChunkRelay, RelayedChunk
from app.serving.front.upstream import Upstream, refusal, transport_error
from app.serving.lifecycle.runs import RunBase, fault_of
from app.serving.preparation.generation import Generation

logger = logging.getLogger(__name__)

ReadT = TypeVar("ReadT", bound=ChatCompletion | ChatCompletionChunk | Completion)

DONE_WITHIN_SECONDS = 1.0
"""How long the end of a stream's body may take after its ``[DONE]`` before the connection is
closed rather than kept for the next request."""


@dataclass(frozen=True)
class UpstreamCall:
    """What is sent: the path, the body and headers built for it, and the global names in the
    body with the name the tenant used for each (to write back in what the upstream says)."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    names: Mapping[str, str]


class UpstreamRun(RunBase):
    """One admitted request, forwarded. :meth:`answer` (JSON) or :meth:`chunks` (SSE) sends
    it, once; the tracker closes it."""

    def __init__(
        self,
        upstream: Upstream,
        call: UpstreamCall,
        generation: Generation,
        reservation: Reservation | None,
    ) -> None:
        super().__init__(generation, reservation)
        self.call = call
        self._upstream = upstream
        self._streamed = bool(call.body.get("stream"))
        self._response: Response | None = None
        self._started = time.monotonic()
        # completion tokens seen when a token was last timed
        self._timed_tokens = 0
        self._sent = False
        self._prompt_tokens: int | None = None
        self._total: int | None = None
        # choice index -> completion tokens so far (continuous usage counts per choice)
        self._per_choice: dict[int, int] = {}
        # choices whose last chunk came: they hold nothing unsent
        self._finished_choices: set[int] = set()

    @property
    def prompt_tokens(self) -> int:
        if self._prompt_tokens is None:
            return self.generation.prompt_tokens
        return self._prompt_tokens

    @property
    def completion_tokens(self) -> int:
        if self._total is not None:
            return self._total
        if self._per_choice:
            streamed = sum(self._per_choice.values())
            if self.finished or self.failed:
                return streamed
            unfinished = len(self._per_choice.keys() - self._finished_choices)
            unsent = (int(self.call.body.get("stream_interval", 1)) - 1) * unfinished
            return min(streamed + unsent, self.generation.completion_budget)
        if self._sent and not self.finished and not self.failed and not self._streamed:
            return self.generation.completion_budget
        return 0

    def when_ended(self, callback: Callable[[], None]) -> None:
        # The engine tier's own server schedules the request; the front has no slot to free.
        return None

    async def answer(self, model: type[ReadT]) -> ReadT:
        """The upstream's whole (non-streamed) answer, read as ``model``."""
        self._send_once()
        call = self.call
        try:
            response = await self._post()
            try:
                content = await response.read()
            finally:
                await response.aclose()  # the client left: the upstream aborts
            if response.status != 200:
                retry_after = response.headers.get("retry-after")
                raise refusal(response.status, content, call.names, retry_after)
            answer = read_answer(model, content, call.names)
        except TransportError as exc:
            failure = transport_error(exc)
            self.fail("version", failure)
            raise failure from exc
        except GatewayError as exc:
            self.fail(fault_of(exc), exc)
            raise
        self._observe(answer)
        self._time_tokens(answer)
        self.finished = True
        return answer

    async def chunks(
        self, model: type[ReadT], relay: ChunkRelay | None = None
    ) -> AsyncGenerator[ReadT | RelayedChunk]:
        """The upstream's stream, one chunk (a ``data:`` payload read as ``model``, or
        relayed by ``relay`` where it can be) at a time, until ``[DONE]``; an error it
        streams is raised as the gateway's. Closing this generator closes the connection:
        the upstream aborts the request."""
        self._send_once()
        call = self.call
        try:
            self._response = response = await self._post()
            if response.status != 200:
                said, retry_after = await response.read(), response.headers.get("retry-after")
                raise refusal(response.status, said, call.names, retry_after)
            async with aclosing(response.events()) as events:
                async for data in events:
                    arrived = clock()
                    if data == b"[DONE]":
                        break
                    chunk: ReadT | RelayedChunk | None = None
                    if relay is not None:
                        chunk = relay.read(data)
                    if chunk is None:
                        chunk = read_answer(model, data, call.names)
                    self._observe(chunk)
                    self._time_tokens(chunk)
                    yield chunk
                    # Back once the reader has answered with it, and asks for the next one.
                    self.gateway_seconds += clock() - arrived
                else:
                    ended = UpstreamError("The upstream ended the stream early.")
                    self.fail("version", ended)
                    raise ended
            self.finished = True
            await response.finish(DONE_WITHIN_SECONDS)
        except TransportError as exc:
            failure = transport_error(exc)
            self.fail("version", failure)
            raise failure from exc
        except GatewayError as exc:
            self.fail(fault_of(exc), exc)
            raise
        finally:
            await self.close()

    async def _post(self) -> Response:
        call = self.call
        began = clock()
        body = json.dumps(call.body, separators=(",", ":"), ensure_ascii=False).encode()
        self.gateway_seconds += clock() - began
        headers = call.headers
        if self.trace_headers:
            # The engine tier's server puts its own span under the front's (app/tracing).
            headers = {**headers, **self.trace_headers}
        return await self._upstream.client.post(call.path, body, headers)

    def _send_once(self) -> None:
        if self._sent:
            raise RuntimeError("a request is forwarded once")
        self._sent = True

    def _observe(
        self, answer: ChatCompletion | ChatCompletionChunk | Completion | RelayedChunk
    ) -> None:
        usage = answer.usage
        if usage is None:
            return
        self._prompt_tokens = usage.prompt_tokens
        if self._streamed and answer.choices:
            for choice in answer.choices:
                self._per_choice[choice.index] = usage.completion_tokens
                if choice.finish_reason is not None:
                    self._finished_choices.add(choice.index)
        else:
            # The answer's usage, or a stream's final usage chunk (no choices): the total.
            self._total = usage.completion_tokens

    def _time_tokens(
        self, answer: ChatCompletion | ChatCompletionChunk | Completion | RelayedChunk
    ) -> None:
        """Note the first choice's finish reason and, in a stream, a chunk that carries output
        (chat's opening role chunk does not): the first one is the time to first token. A
        whole answer says nothing of when its tokens came."""
        if answer.choices and answer.choices[0].finish_reason is not None:
            self.timing.finish_reason = answer.choices[0].finish_reason
        if not self._streamed:
            return
        produced = self._total if self._total is not None else sum(self._per_choice.values())
        if not produced or produced == self._timed_tokens:
            return
        self._timed_tokens = produced
        now = time.monotonic()
        if self.timing.first_token_at is None:
            generation = self.generation
            labels = (generation.principal.tenant.id, generation.target.model)
            metrics.TIME_TO_FIRST_TOKEN.labels(*labels).observe(now - self._started)
        self.timing.token_seen(now)

    async def close(self) -> None:
        """Close the upstream connection if it is still open (a stream that was never read to
        its end nor closed): the upstream aborts a request whose client (this front) has
        gone."""
        if self._response is not None:
            await self._response.aclose()


def read_answer(model: type[ReadT], content: bytes, names: Mapping[str, str]) -> ReadT:
    """``content`` as ``model``; an error the upstream sent in its place (a stream's error
    event) as the gateway's error."""
    try:
        return cast(ReadT, model.model_validate_json(content))
    except ValidationError as exc:
        try:
            payload = json.loads(content)
        except ValueError:
            raise UpstreamError("The upstream answered something that is not JSON.") from exc
        if isinstance(payload, dict) and payload.get("error") is not None:
            raise _streamed_error(payload["error"], names) from None
        logger.warning("unexpected upstream answer: %s", exc)
        message = "The upstream answered in a shape this gateway does not know."
        raise UpstreamError(message) from exc


def _streamed_error(error: Any, names: Mapping[str, str]) -> GatewayError:
    """An error event in the upstream's stream, as the gateway's error (vLLM puts the HTTP
    status it would have answered in ``code``)."""
    code = error.get("code") if isinstance(error, Mapping) else None
    status = code if isinstance(code, int) and 400 <= code <= 599 else 500
    return refusal(status, json.dumps({"error": error}).encode(), names)
