"""The soak's clients: a seeded mix of requests, each recorded as the client saw it.

Every request is one :class:`Spec` (tenant, model, endpoint, streamed or not, and whether the
client leaves mid-stream) and ends as one :class:`Outcome`: the HTTP status, the gateway's
``x-request-id`` (the usage ledger's ``request_id``), the usage the response reported, the
content chunks a stream delivered, and anything wrong with the answer. Nothing here judges the
gateway's books; :mod:`tools.soak` does, from these outcomes.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

Endpoint = Literal["chat", "completions"]
PATHS: dict[Endpoint, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}

PROMPTS = (
    "Summarise the duties of a data controller in two sentences.",
    "Write a short note for a patient's follow-up visit.",
    "A caller says their internet is down. What do you ask first?",
    "What is the capital of France?",
    "List three tips for writing a clear email.",
    "Explain what a lease agreement is.",
)
LONG_PROMPT = "Count from 1 to 500, comma separated."
"""For the streams a client leaves: long enough that the engine is still generating then."""
LEAVER_MAX_TOKENS = 256
LEAVE_AFTER_CHUNKS = (1, 4)
SHORT_MAX_TOKENS = (8, 48)


@dataclass(frozen=True)
class Spec:
    tenant: str
    model: str
    endpoint: Endpoint
    stream: bool
    max_tokens: int
    prompt: str
    temperature: float
    leave_after: int | None = None
    """Content chunks after which the client closes the connection (``None``: reads it all)."""

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": self.prompt}]
        else:
            body["prompt"] = self.prompt
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body


@dataclass
class Outcome:
    spec: Spec
    status: int | None = None
    request_id: str | None = None
    error_code: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    content_chunks: int = 0
    left: bool = False
    """The client closed the stream before ``[DONE]``."""
    hung: bool = False
    """No complete answer within the per-request timeout."""
    problem: str | None = None
    """What was wrong with the answer; ``None`` when nothing was."""
    started: float = 0.0
    """``time.monotonic()`` when it was sent."""
    seconds: float = 0.0

    @property
    def complete(self) -> bool:
        """A 200 whose whole answer, usage included, arrived."""
        return self.status == 200 and not self.left and not self.hung and self.problem is None


@dataclass
class Mix:
    """Draws the next request of a client: a random tenant, one of its models, chat or
    completions, streamed or not. Exactly every ``1 / leave_rate``-th stream (not a random
    share, which strays far from it over a few hundred streams) is one the client leaves."""

    models: Mapping[str, Sequence[str]]
    rng: random.Random
    leave_rate: float = 0.1
    stream_share: float = 0.5
    _streams: int = 0
    _leavers: int = 0

    def next(self) -> Spec:
        tenant = self.rng.choice(sorted(self.models))
        model = self.rng.choice(list(self.models[tenant]))
        endpoint: Endpoint = "chat" if self.rng.random() < 0.6 else "completions"
        stream = self.rng.random() < self.stream_share
        self._streams += stream
        if stream and int(self._streams * self.leave_rate + 1e-9) > self._leavers:
            self._leavers += 1
            return Spec(
                tenant,
                model,
                endpoint,
                True,
                LEAVER_MAX_TOKENS,
                LONG_PROMPT,
                0.0,
                leave_after=self.rng.randint(*LEAVE_AFTER_CHUNKS),
            )
        return Spec(
            tenant,
            model,
            endpoint,
            stream,
            self.rng.randint(*SHORT_MAX_TOKENS),
            self.rng.choice(PROMPTS),
            self.rng.choice((0.0, 0.8)),
        )


@dataclass
class Load:
    """Where the clients send their requests, with which keys, for how long."""

    base_url: str
    keys: Mapping[str, str]
    request_timeout: float
    outcomes: list[Outcome] = field(default_factory=list)

    async def send(self, client: httpx.AsyncClient, spec: Spec) -> Outcome:
        """One request; its outcome is also appended to :attr:`outcomes`."""
        outcome = Outcome(spec)
        self.outcomes.append(outcome)
        outcome.started = started = time.monotonic()
        try:
            await asyncio.wait_for(self._exchange(client, spec, outcome), self.request_timeout)
        except TimeoutError:
            outcome.hung = True
        except (httpx.HTTPError, ValueError) as exc:
            outcome.problem = f"{type(exc).__name__}: {exc}"
        outcome.seconds = time.monotonic() - started
        return outcome

    async def mixed_client(self, client: httpx.AsyncClient, mix: Mix, until: float) -> None:
        while time.monotonic() < until:
            await self.send(client, mix.next())

    async def paced_client(
        self, client: httpx.AsyncClient, tenant: str, model: str, every: float, until: float
    ) -> None:
        """Short requests for ``tenant``, one every ``every`` seconds whether or not the
        earlier ones have been answered: the offered rate does not drop when the engine is
        slow."""
        spec = Spec(tenant, model, "chat", False, 8, PROMPTS[3], 0.0)
        sent = []
        while time.monotonic() < until:
            sent.append(asyncio.create_task(self.send(client, spec)))
            await asyncio.sleep(every)
        await asyncio.gather(*sent)

    async def _exchange(self, client: httpx.AsyncClient, spec: Spec, outcome: Outcome) -> None:
        request = client.build_request(
            "POST",
            self.base_url + PATHS[spec.endpoint],
            json=spec.body(),
            headers={"Authorization": f"Bearer {self.keys[spec.tenant]}"},
        )
        response = await client.send(request, stream=True)
        try:
            outcome.status = response.status_code
            outcome.request_id = response.headers.get("x-request-id")
            if response.status_code != 200:
                read_error(await response.aread(), outcome)
            elif spec.stream:
                await read_stream(response, spec, outcome)
            else:
                read_completion(await response.aread(), spec, outcome)
        finally:
            # Unread, the connection is closed, not pooled: the gateway sees the client leave.
            await response.aclose()


def read_error(body: bytes, outcome: Outcome) -> None:
    """An error response must be OpenAI-shaped: ``{"error": {"message", "type", "param",
    "code"}}``."""
    try:
        error = json.loads(body)["error"]
        if not {"message", "type", "param", "code"} <= set(error):
            raise KeyError(sorted(set(error)))
        outcome.error_code = str(error["code"] or error["type"])
    except (ValueError, KeyError, TypeError):
        outcome.problem = f"not an OpenAI error: {body[:200]!r}"


def read_completion(body: bytes, spec: Spec, outcome: Outcome) -> None:
    data = json.loads(body)
    usage = data.get("usage") or {}
    outcome.prompt_tokens = usage.get("prompt_tokens")
    outcome.completion_tokens = usage.get("completion_tokens")
    if outcome.completion_tokens is None or outcome.prompt_tokens is None:
        outcome.problem = "no usage in the response"
    elif not data.get("choices"):
        outcome.problem = "no choices in the response"


def chunk_text(chunk: Mapping[str, Any], endpoint: Endpoint) -> str:
    text = ""
    for choice in chunk.get("choices") or ():
        part = (choice.get("delta") or {}).get("content") if endpoint == "chat" else choice["text"]
        text += part or ""
    return text


async def read_stream(response: httpx.Response, spec: Spec, outcome: Outcome) -> None:
    """Read the events (``data: {...}`` lines, then ``data: [DONE]``), counting the chunks
    that carry content; leave after ``spec.leave_after`` of them."""
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        data = line.removeprefix("data: ")
        if data == "[DONE]":
            if outcome.completion_tokens is None:
                outcome.problem = "stream ended without a usage chunk"
            return
        chunk = json.loads(data)
        if "error" in chunk:
            outcome.problem = f"in-band error: {chunk['error']}"
            continue
        usage = chunk.get("usage")
        if usage:
            outcome.prompt_tokens = usage["prompt_tokens"]
            outcome.completion_tokens = usage["completion_tokens"]
        if chunk_text(chunk, spec.endpoint):
            outcome.content_chunks += 1
            if spec.leave_after is not None and outcome.content_chunks >= spec.leave_after:
                outcome.left = True
                return
    outcome.problem = "stream ended without data: [DONE]"
