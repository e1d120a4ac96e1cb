"""A request run on the upstream (the front role): one HTTP exchange, and what it produced.

What is charged, however the request ends:

- the upstream's own ``usage`` when it sent one: the whole answer's, or, for a stream cut
  short, the last counts it streamed (the front always asks for ``continuous_usage_stats``:
  each chunk says how many tokens its choice has produced so far);
- a streamed request with no counts yet (the client left before the first chunk): the prompt,
  with no completion tokens, as the upstream produced none it sent;
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
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from app import metrics
from app.errors import GatewayError, UpstreamError
from app.quota import Reservation
from app.serving.front.upstream import Upstream, refusal, transport_error
from app.serving.lifecycle.runs import RunBase
from app.serving.preparation.generation import Generation


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
        self._response: httpx.Response | None = None
        self._started = time.monotonic()
        # completion tokens seen when a token was last timed
        self._timed_tokens = 0
        self._sent = False
        self._prompt_tokens: int | None = None
        self._total: int | None = None
        # choice index -> completion tokens so far (continuous usage counts per choice)
        self._per_choice: dict[int, int] = {}

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
            return sum(self._per_choice.values())
        if self._sent and not self.finished and not self.failed and not self._streamed:
            return self.generation.completion_budget
        return 0

    @property
    def _streamed(self) -> bool:
        return bool(self.call.body.get("stream"))

    def when_ended(self, callback: Callable[[], None]) -> None:
        # The engine tier's own server schedules the request; the front has no slot to free.
        return None

    async def answer(self) -> dict[str, Any]:
        """The upstream's whole (non-streamed) answer."""
        self._send_once()
        call = self.call
        try:
            response = await self._upstream.client.post(
                call.path, json=call.body, headers=call.headers
            )
            if response.status_code != httpx.codes.OK:
                retry_after = response.headers.get("retry-after")
                raise refusal(response.status_code, response.content, call.names, retry_after)
            payload = _object(response.content)
        except httpx.HTTPError as exc:
            self.failed = True
            raise transport_error(exc) from exc
        except GatewayError:
            self.failed = True
            raise
        self._observe(payload)
        self._time_tokens(payload)
        self.finished = True
        return payload

    async def chunks(self) -> AsyncGenerator[dict[str, Any]]:
        """The upstream's stream, one chunk (a ``data:`` payload) at a time, until
        ``[DONE]``; an error it streams is raised as the gateway's. Closing this generator
        closes the connection: the upstream aborts the request."""
        self._send_once()
        call = self.call
        client = self._upstream.client
        try:
            request = client.build_request("POST", call.path, json=call.body, headers=call.headers)
            self._response = response = await client.send(request, stream=True)
            if response.status_code != httpx.codes.OK:
                said, retry_after = await response.aread(), response.headers.get("retry-after")
                raise refusal(response.status_code, said, call.names, retry_after)
            async for line in response.aiter_lines():
                data = line.removeprefix("data:").strip() if line.startswith("data:") else None
                if data is None:
                    continue
                if data == "[DONE]":
                    self.finished = True
                    return
                payload = _object(data.encode())
                error = payload.get("error")
                if error is not None:
                    raise _streamed_error(error, call.names)
                self._observe(payload)
                self._time_tokens(payload)
                yield payload
        except httpx.HTTPError as exc:
            self.failed = True
            raise transport_error(exc) from exc
        except GatewayError:
            self.failed = True
            raise
        finally:
            await self.close()
        self.failed = True
        raise UpstreamError("The upstream ended the stream early.")

    def _send_once(self) -> None:
        if self._sent:
            raise RuntimeError("a request is forwarded once")
        self._sent = True

    def _observe(self, payload: Mapping[str, Any]) -> None:
        usage = payload.get("usage")
        if not isinstance(usage, Mapping):
            return
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if not isinstance(prompt, int) or not isinstance(completion, int):
            return
        self._prompt_tokens = prompt
        choices = payload.get("choices")
        if self._streamed and choices:
            for choice in choices:
                if isinstance(choice, Mapping) and isinstance(choice.get("index"), int):
                    self._per_choice[choice["index"]] = completion
        else:
            # The answer's usage, or a stream's final usage chunk (no choices): the total.
            self._total = completion

    def _time_tokens(self, payload: Mapping[str, Any]) -> None:
        """Note the first choice's finish reason and, in a stream, a chunk that carries output
        (chat's opening role chunk does not): the first one is the time to first token. A
        whole answer says nothing of when its tokens came."""
        choices = payload.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        if isinstance(first, Mapping) and isinstance(first.get("finish_reason"), str):
            self.timing.finish_reason = first["finish_reason"]
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


def _object(content: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(content)
    except ValueError as exc:
        raise UpstreamError("The upstream answered something that is not JSON.") from exc
    if not isinstance(payload, dict):
        raise UpstreamError("The upstream answered something that is not a JSON object.")
    return payload


def _streamed_error(error: Any, names: Mapping[str, str]) -> GatewayError:
    """An error event in the upstream's stream, as the gateway's error (vLLM puts the HTTP
    status it would have answered in ``code``)."""
    code = error.get("code") if isinstance(error, Mapping) else None
    status = code if isinstance(code, int) and 400 <= code <= 599 else 500
    return refusal(status, json.dumps({"error": error}).encode(), names)
