"""An engine that costs next to nothing, behind the gateway's engine interface: each step
gives every running request one token, as a decode step of vLLM's batch does, and the steps
are paced so that the engine produces ``tokens_per_second`` in all, however many requests
share them. What the gateway process spends beyond it is the gateway's own cost.

Like vLLM's output collector, it hands each reader one output per step with that step's
token, and merges the tokens of steps a slow reader has not taken yet into one output. Like
vLLM's ``stream_interval`` (the engine's, raised by a request's), it hands over the first
token at once, then an output once it holds that many tokens, and the last.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, ClassVar

from vllm import CompletionOutput, RequestOutput, SamplingParams

from app.tenancy.adapters import Adapter

VOCABULARY = 256


class CharTokenizer:
    """One token per character: tokenising costs the gateway what a short prompt does (the
    serving tests' scripted engine uses it too). Its tokens are bytes, 0 the end of text: what
    llguidance needs to compile an output constraint against it."""

    eos_token_id = 0
    bos_token_id = None
    tokens: ClassVar[list[bytes]] = [bytes([token]) for token in range(VOCABULARY)]

    def __call__(self, text: str | bytes) -> list[int]:
        """llguidance's way in: text or bytes to token ids, one byte a token."""
        return list(text if isinstance(text, bytes) else text.encode())

    def __len__(self) -> int:
        return VOCABULARY

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) % VOCABULARY for c in text]

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(chr(t) for t in token_ids)

    def apply_chat_template(
        self, messages: list[dict[str, str]], *, add_generation_prompt: bool, tokenize: bool
    ) -> str:
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


class _Running:
    __slots__ = (
        "_choices",
        "_interval",
        "budget",
        "finished",
        "gathered",
        "pending",
        "produced",
        "prompt",
        "ready",
        "request_id",
    )

    def __init__(
        self, request_id: str, prompt: list[int], budget: int, choices: int, interval: int
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.budget = budget
        self.produced = 0
        self.finished = False
        self.pending: RequestOutput | None = None
        self.gathered = 0  # tokens in ``pending``
        self.ready = asyncio.Event()  # ``pending`` is due to its reader
        self._choices = choices
        self._interval = interval

    def put(self, token: int | None, finish_reason: str | None) -> None:
        tokens = [] if token is None else [token]
        text = "" if token is None else chr(ord("a") + token % 26)
        pending = self.pending
        if pending is None:
            self.pending = RequestOutput(
                self.request_id,
                None,
                self.prompt,
                None,
                [
                    CompletionOutput(
                        index=i,
                        text=text,
                        token_ids=list(tokens),
                        cumulative_logprob=None,
                        logprobs=None,
                        finish_reason=finish_reason,
                    )
                    for i in range(self._choices)
                ],
                finished=finish_reason is not None,
            )
        else:
            for choice in pending.outputs:
                choice.text += text
                choice.token_ids.extend(tokens)  # type: ignore[attr-defined]
                choice.finish_reason = finish_reason
            pending.finished = finish_reason is not None
        self.gathered += len(tokens)
        if finish_reason is not None or self.produced == 1 or self.gathered >= self._interval:
            self.ready.set()

    def take(self) -> RequestOutput:
        output, self.pending, self.gathered = self.pending, None, 0
        self.ready.clear()
        assert output is not None
        return output


class PacedEngine:
    """Generates ``max_tokens`` tokens per choice for every request, one per step, at
    ``tokens_per_second`` over all requests, in outputs of ``stream_interval`` tokens."""

    def __init__(
        self, tokens_per_second: float, *, max_model_len: int = 1_000_000, stream_interval: int = 1
    ) -> None:
        self.tokens_per_second = tokens_per_second
        self.max_model_len = max_model_len
        self.stream_interval = stream_interval
        self.steps = 0
        self._tokenizer = CharTokenizer()
        self._running: dict[str, _Running] = {}
        self._wake = asyncio.Event()
        self._stepper: asyncio.Task[None] | None = None

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def num_unfinished_requests(self) -> int:
        return len(self._running)

    async def check_health(self) -> None:
        return None

    async def remove_adapter(self, adapter: Adapter) -> None:
        return None

    async def abort(self, request_id: str) -> None:
        running = self._running.pop(request_id, None)
        if running is not None and not running.finished:
            running.finished = True
            running.put(None, "abort")

    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        request_id: str,
        adapter: Adapter | None,
        cache_salt: str | None = None,
        on_abandoned: Callable[[RequestOutput], None] | None = None,
        trace_headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[RequestOutput]:
        interval = max(self.stream_interval, params.stream_interval or 1)
        running = _Running(
            request_id, list(prompt_token_ids), params.max_tokens or 1, max(params.n, 1), interval
        )
        self._running[request_id] = running
        if self._stepper is None:
            self._stepper = asyncio.create_task(self._step_forever())
        self._wake.set()
        try:
            while True:
                await running.ready.wait()
                output = running.take()
                yield output
                if output.finished:
                    return
        finally:
            await self.abort(request_id)
            unread, running.pending = running.pending, None
            if unread is not None and on_abandoned is not None:
                on_abandoned(unread)

    async def close(self) -> None:
        if self._stepper is not None:
            self._stepper.cancel()

    async def _step_forever(self) -> None:
        due = time.monotonic()
        while True:
            if not self._running:
                self._wake.clear()
                await self._wake.wait()
                due = time.monotonic()
            # A step that comes late is not made up for with a burst: the batch slows down.
            due = max(due + self.step_interval(), time.monotonic())
            await asyncio.sleep(due - time.monotonic())
            self.step()

    def step_interval(self) -> float:
        """Seconds from one step to the next: ``tokens_per_second`` over the whole batch."""
        return len(self._running) / self.tokens_per_second

    def step(self) -> None:
        """One token for every running request."""
        self.steps += 1
        for running in list(self._running.values()):
            running.produced += 1
            last = running.produced >= running.budget
            if last:
                running.finished = True
                del self._running[running.request_id]
            token = len(running.prompt) + running.produced
            running.put(token, "length" if last else None)
