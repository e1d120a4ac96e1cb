"""Scripted engines the Responses tests share."""

from __future__ import annotations

import asyncio

from vllm import CompletionOutput, RequestOutput

from tests.support.scripted_engine import ScriptedEngine, ScriptedRequest


class WritingEngine(ScriptedEngine):
    """Writes ``text`` four characters a step, then finishes with ``stop``."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    async def _produce(self, request: ScriptedRequest) -> None:
        pieces = [self.text[i : i + 4] for i in range(0, len(self.text), 4)]
        for step, piece in enumerate(pieces):
            await asyncio.sleep(0)
            last = step == len(pieces) - 1
            request.produced += 1
            request.finished = last
            output = CompletionOutput(
                index=0,
                text=piece,
                token_ids=[ord(piece[0])],
                cumulative_logprob=None,
                logprobs=None,
                finish_reason="stop" if last else None,
            )
            request.put(
                RequestOutput(
                    request.request_id,
                    None,
                    request.prompt_token_ids,
                    None,
                    [output],
                    finished=last,
                )
            )
