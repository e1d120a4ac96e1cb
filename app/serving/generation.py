"""What chat and text completions share: sampling, limits, running a request."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from vllm import CompletionOutput, RequestOutput, SamplingParams
from vllm.sampling_params import RequestOutputKind

from app.engine.base import Engine
from app.errors import BadRequestError, ContextLengthExceededError, EngineUnavailableError
from app.protocol import ChatCompletionRequest, CompletionRequest, Usage
from app.serving.tracking import Admission, RequestTracker
from app.tenancy.models import ModelTarget, Principal

CompletionLike = ChatCompletionRequest | CompletionRequest


@dataclass(frozen=True)
class Generation:
    """One request, ready for the engine."""

    request_id: str
    endpoint: str
    principal: Principal
    target: ModelTarget
    prompt_token_ids: Sequence[int]
    params: SamplingParams
    admission: Admission | None = None

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def headers(self) -> dict[str, str]:
        """The ``x-ratelimit-*`` headers of the response."""
        return dict(self.admission.reservation.headers) if self.admission else {}


def completion_budget(prompt_tokens: int, requested: int | None, max_model_len: int) -> int:
    """The max_tokens to run with; the whole remaining context when none is asked."""
    if requested is None:
        requested = max_model_len - prompt_tokens
    if requested < 1 or prompt_tokens + requested > max_model_len:
        raise ContextLengthExceededError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + max(requested, 1)} tokens ({prompt_tokens} in the "
            f"prompt, {max(requested, 1)} for the completion). Please reduce the length of "
            "the prompt or of the completion.",
            param="messages" if requested is None else "max_tokens",
        )
    return requested


def sampling_params(
    request: CompletionLike, prompt_tokens: int, max_model_len: int
) -> SamplingParams:
    max_tokens = completion_budget(prompt_tokens, request.completion_limit, max_model_len)
    if request.min_tokens > max_tokens:
        raise BadRequestError(
            f"`min_tokens` ({request.min_tokens}) is more than the completion may have "
            f"({max_tokens}).",
            param="min_tokens",
        )
    return SamplingParams(
        n=request.n,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        max_tokens=max_tokens,
        min_tokens=request.min_tokens,
        ignore_eos=request.ignore_eos,
        stop=request.stop_sequences,
        seed=request.seed,
        presence_penalty=request.presence_penalty or 0.0,
        frequency_penalty=request.frequency_penalty or 0.0,
        logprobs=request.num_logprobs,
        # Deltas even when not streaming: what was generated is known (and
        # charged) however a request ends.
        output_kind=RequestOutputKind.DELTA,
    )


def usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


def finish_reason(reason: str | None) -> str | None:
    # vLLM also reports "abort"; OpenAI clients only know "stop" and "length".
    return None if reason is None else ("length" if reason == "length" else "stop")


async def run(
    engine: Engine, generation: Generation, tracker: RequestTracker
) -> list[CompletionOutput]:
    """Run to the end; every choice's text, tokens and logprobs, by index."""
    choices: dict[int, CompletionOutput] = {}
    async for output in stream(engine, generation, tracker):
        for delta in output.outputs:
            whole = choices.setdefault(
                delta.index,
                CompletionOutput(
                    index=delta.index, text="", token_ids=[], cumulative_logprob=None, logprobs=None
                ),
            )
            whole.text += delta.text
            whole.token_ids = [*whole.token_ids, *delta.token_ids]
            if delta.logprobs is not None:
                whole.logprobs = [*(whole.logprobs or []), *delta.logprobs]
            whole.finish_reason = delta.finish_reason
    if len(choices) != generation.params.n:
        raise EngineUnavailableError("The engine ended the request early.")
    return [choices[i] for i in sorted(choices)]


async def stream(
    engine: Engine, generation: Generation, tracker: RequestTracker
) -> AsyncIterator[RequestOutput]:
    with tracker.track(generation) as progress:
        async for output in engine.generate(
            generation.prompt_token_ids,
            generation.params,
            generation.request_id,
            generation.target.adapter,
            # A tenant's cached prefixes never serve another tenant: no timing
            # side channel reveals what others have asked.
            cache_salt=generation.principal.tenant.id,
        ):
            progress.observe(output)
            yield output
