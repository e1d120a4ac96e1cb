"""Reading an OpenAI chat-completions stream (server-sent events) as it arrives."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

DONE = "[DONE]"


def sse_data(line: str) -> str | None:
    """The payload of a ``data:`` line; None for blank lines, comments and other fields."""
    if not line.startswith("data:"):
        return None
    return line[len("data:") :].strip()


@dataclass
class StreamTiming:
    """What one streamed response showed, fed event by event with arrival times.

    A token is a chunk that carries generated text: OpenAI-style servers send
    one such chunk per engine step per request, so the gaps between them are
    the inter-token latencies a client sees. The role-only opening chunk and
    the usage-only closing chunk carry no text and are not tokens.
    """

    token_times: list[float] = field(default_factory=list)
    completion_tokens: int | None = None  # from the usage chunk, when sent
    prompt_tokens: int | None = None
    error: str | None = None
    done: bool = False

    def feed(self, payload: str, now: float) -> None:
        if payload == DONE:
            self.done = True
            return
        try:
            chunk: dict[str, Any] = json.loads(payload)
        except ValueError:
            self.error = f"unparseable event: {payload[:80]}"
            return
        if "error" in chunk:
            error = chunk["error"]
            self.error = str(error.get("message", error) if isinstance(error, dict) else error)
            return
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content") or choice.get("text"):
                self.token_times.append(now)
                break
        usage = chunk.get("usage")
        if usage:
            self.completion_tokens = usage.get("completion_tokens")
            self.prompt_tokens = usage.get("prompt_tokens")

    @property
    def output_tokens(self) -> int:
        if self.completion_tokens is not None:
            return self.completion_tokens
        return len(self.token_times)

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:], strict=False)]
