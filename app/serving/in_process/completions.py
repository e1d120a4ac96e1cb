"""``POST /v1/completions``: raw text (or token ids) in, text out."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from vllm import CompletionOutput

from app.engine.base import Engine
from app.protocol import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    Usage,
)
from app.quota import Reservation
from app.serving.chunk_encoding import StreamChunks, completion_choice
from app.serving.in_process.engine_run import EngineRun
from app.serving.in_process.logprobs import completion_logprobs
from app.serving.preparation import generation as gen
from app.serving.preparation.completions import CompletionPreparation
from app.serving.sse import event_stream


class CompletionService(gen.Prepared[CompletionRequest]):
    """Text completions on the engine in this process."""

    fails_before_streaming = False

    def __init__(self, preparation: CompletionPreparation, engine: Engine) -> None:
        super().__init__(preparation)
        self.engine = engine

    def start(
        self,
        request: CompletionRequest,
        generation: gen.Generation,
        reservation: Reservation | None,
    ) -> EngineRun:
        return EngineRun(self.engine, generation, reservation)

    async def complete(self, request: CompletionRequest, run: EngineRun) -> Completion:
        generation = run.generation
        outputs = await gen.collect(run.outputs(), generation.params.n)
        echo = self._echo(request, generation)
        choices = [
            CompletionChoice(
                index=out.index,
                text=echo + out.text,
                logprobs=self._logprobs(request, out, len(echo)),
                finish_reason=gen.finish_reason(out.finish_reason),
            )
            for out in outputs
        ]
        completion_tokens = sum(len(out.token_ids) for out in outputs)
        return Completion(
            id=_completion_id(generation),
            model=request.model,
            choices=choices,
            usage=gen.usage(generation.prompt_tokens, completion_tokens),
        )

    def stream(self, request: CompletionRequest, run: EngineRun) -> AsyncIterator[str]:
        generation = run.generation
        echo = self._echo(request, generation)
        offsets = dict.fromkeys(range(request.n), len(echo))

        # One creation time for the whole stream, as OpenAI and vLLM send it.
        created = int(time.time())

        def chunk(choices: list[CompletionChoice], usage: Usage | None = None) -> Completion:
            return Completion(
                id=_completion_id(generation),
                created=created,
                model=request.model,
                choices=choices,
                usage=usage,
            )

        chunks = StreamChunks(chunk([]), completion_choice, request.n)

        def delta(out: CompletionOutput) -> str:
            logprobs = self._logprobs(request, out, offsets[out.index])
            offsets[out.index] += len(out.text)
            return chunks(out.index, out.text, logprobs, gen.finish_reason(out.finish_reason))

        opening = (
            [
                chunk([CompletionChoice(index=i, text=echo, finish_reason=None)])
                for i in range(request.n)
            ]
            if echo
            else []
        )
        return event_stream(
            run.outputs(),
            opening=opening,
            chunk=delta,
            usage=chunks.usage if request.include_usage else None,
            prompt_tokens=generation.prompt_tokens,
        )

    def _echo(self, request: CompletionRequest, generation: gen.Generation) -> str:
        if not request.echo:
            return ""
        if isinstance(request.prompt, str):
            return request.prompt
        return str(self.engine.tokenizer.decode(list(generation.prompt_token_ids)))

    @staticmethod
    def _logprobs(
        request: CompletionRequest, out: CompletionOutput, offset: int
    ) -> CompletionLogprobs | None:
        if request.num_logprobs is None or out.logprobs is None:
            return None
        return completion_logprobs(out.token_ids, out.logprobs, request.num_logprobs, offset)


def _completion_id(generation: gen.Generation) -> str:
    return f"cmpl-{generation.request_id}"
