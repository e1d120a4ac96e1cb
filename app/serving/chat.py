"""``POST /v1/chat/completions``: chat template in, assistant message out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial

from vllm import CompletionOutput

from app.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatLogprobs,
    Usage,
)
from app.serving import generation as gen
from app.serving.logprobs import chat_logprobs
from app.serving.sse import event_stream
from app.serving.tracking import Run
from app.tenancy.tenants import ModelTarget, Principal


class ChatService(gen.EngineEndpoint):
    endpoint = "chat.completions"

    def prepare(
        self,
        request: ChatCompletionRequest,
        principal: Principal,
        target: ModelTarget,
        request_id: str,
    ) -> gen.Generation:
        messages = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            for m in request.messages
        ]
        tokenizer = self.engine.tokenizer
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt = tokenizer.encode(text, add_special_tokens=False)
        return self._generation(request, prompt, principal, target, request_id)

    async def complete(self, request: ChatCompletionRequest, run: Run) -> ChatCompletion:
        generation = run.generation
        outputs = await gen.collect(run.outputs(), generation.params.n)
        choices = [
            ChatChoice(
                index=out.index,
                message=AssistantMessage(content=out.text),
                logprobs=self._logprobs(request, out),
                finish_reason=gen.finish_reason(out.finish_reason),
            )
            for out in outputs
        ]
        completion_tokens = sum(len(out.token_ids) for out in outputs)
        return ChatCompletion(
            id=_completion_id(generation),
            model=request.model,
            choices=choices,
            usage=gen.usage(generation.prompt_tokens, completion_tokens),
        )

    def stream(self, request: ChatCompletionRequest, run: Run) -> AsyncIterator[str]:
        generation = run.generation

        def chunk(
            choices: list[ChatChunkChoice], usage: Usage | None = None
        ) -> ChatCompletionChunk:
            return ChatCompletionChunk(
                id=_completion_id(generation), model=request.model, choices=choices, usage=usage
            )

        def delta(out: CompletionOutput) -> ChatCompletionChunk:
            return chunk(
                [
                    ChatChunkChoice(
                        index=out.index,
                        delta=ChatDelta(content=out.text),
                        logprobs=self._logprobs(request, out),
                        finish_reason=gen.finish_reason(out.finish_reason),
                    )
                ]
            )

        opening = [
            chunk([ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content=""))])
            for i in range(request.n)
        ]
        return event_stream(
            run.outputs(),
            opening=opening,
            chunk=delta,
            usage=partial(chunk, []) if request.include_usage else None,
            prompt_tokens=generation.prompt_tokens,
        )

    @staticmethod
    def _logprobs(request: ChatCompletionRequest, out: CompletionOutput) -> ChatLogprobs | None:
        if request.num_logprobs is None or out.logprobs is None:
            return None
        return chat_logprobs(out.token_ids, out.logprobs, request.num_logprobs)


def _completion_id(generation: gen.Generation) -> str:
    return f"chatcmpl-{generation.request_id}"
