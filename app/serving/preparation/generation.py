"""What chat and text completions share: the prepared request, sampling, limits, and
merging the engine's deltas into whole choices."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from vllm import CompletionOutput, RequestOutput, SamplingParams
from vllm.logprobs import LogprobsOnePosition
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

from app.errors import BadRequestError, ContextLengthExceededError, EngineUnavailableError
from app.protocol import ChatCompletionRequest, CompletionRequest, Usage
from app.serving.preparation.per_tokenizer import per_tokenizer
from app.serving.preparation.structured import OutputConstraints
from app.tenancy.tenants import ModelTarget, Principal

CompletionLike = ChatCompletionRequest | CompletionRequest
RequestT = TypeVar("RequestT", bound=CompletionLike)


@dataclass(frozen=True)
class Generation:
    """One request, ready for the engine."""

    request_id: str
    endpoint: str
    principal: Principal
    target: ModelTarget
    prompt_token_ids: Sequence[int]
    params: SamplingParams
    # A shadow run: the same request on a candidate version, its answer discarded, unbilled.
    shadow: bool = False
    # That the engine can enforce the output constraint (llguidance's compile, blocking: the
    # tracker runs it in the tenant's turn); None where there is nothing to check.
    compile_check: Callable[[], None] | None = None

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def completion_budget(self) -> int:
        """The most completion tokens the request may produce, over all its choices."""
        return (self.params.max_tokens or 0) * self.params.n

    @property
    def worst_case_tokens(self) -> int:
        """What the quotas reserve and the scheduler charges before the request has run."""
        return self.prompt_tokens + self.completion_budget


class PromptModel(Protocol):
    """What preparing a request needs of the model: its tokenizer and context length. The
    in-process engine has both; the front role loads them from the model directory, with no
    engine, so that it refuses what the engine would refuse before anything is held."""

    max_model_len: int

    @property
    def tokenizer(self) -> Any:
        """A Hugging Face tokenizer (``encode``, ``decode``, ``apply_chat_template``)."""


class Preparation(ABC, Generic[RequestT]):
    """How an endpoint's request becomes a :class:`Generation`, wherever it then runs (the
    templates, tools, output constraints, logprobs and the worst case to reserve): the same
    400s for the same fields in both backends, before anything is held. Each backend's
    service holds one (:class:`Prepared`)."""

    endpoint: str

    def __init__(self, model: PromptModel, constraints: OutputConstraints | None = None) -> None:
        self.model = model
        self.constraints = constraints or OutputConstraints()

    @abstractmethod
    def prepare(
        self, request: RequestT, principal: Principal, target: ModelTarget, request_id: str
    ) -> Generation:
        """Tokenise ``request`` and build its sampling parameters (CPU work: the tracker
        runs it off the event loop, in the tenant's turn)."""

    def _refuse_if_never_fits(self, text: str, param: str) -> None:
        """Refuse, before it is tokenised, a prompt that cannot fit the context whatever its
        tokens: none spells more than the vocabulary's longest token, and every character is
        at least a byte. Tokenising it would take the tokenizer's thread from every other
        request for as long as its length, only to refuse it."""
        max_model_len = self.model.max_model_len
        longest = longest_token_bytes(self.model.tokenizer)
        if len(text) > longest * (max_model_len - 1):
            raise ContextLengthExceededError(
                f"This model's maximum context length is {max_model_len} tokens. However, "
                f"your prompt is {len(text)} characters long, more than that many tokens can "
                "hold. Please reduce the length of the prompt.",
                param=param,
            )

    def _generation(
        self,
        request: CompletionLike,
        prompt: list[int],
        principal: Principal,
        target: ModelTarget,
        request_id: str,
    ) -> Generation:
        constraint = self.constraints.constraint(request)
        params = sampling_params(
            request,
            len(prompt),
            self.model.max_model_len,
            vocabulary=len(self.model.tokenizer),
            structured_outputs=None if constraint is None else constraint.params,
        )
        check = self.constraints.compile_check(constraint)
        return Generation(
            request_id, self.endpoint, principal, target, prompt, params, compile_check=check
        )


class Prepared(Generic[RequestT]):
    """A service whose requests ``preparation`` prepares: both backends' services."""

    def __init__(self, preparation: Preparation[RequestT]) -> None:
        self.preparation = preparation
        self.endpoint = preparation.endpoint

    def prepare(
        self, request: RequestT, principal: Principal, target: ModelTarget, request_id: str
    ) -> Generation:
        return self.preparation.prepare(request, principal, target, request_id)


@per_tokenizer
def longest_token_bytes(tokenizer: Any) -> int:
    """The most UTF-8 bytes one of the tokenizer's tokens decodes to. A token that is part of
    a character decodes to a replacement character, which only makes the bound looser."""
    decoded = (tokenizer.decode([token]) for token in range(len(tokenizer)))
    return max(len(text.encode()) for text in decoded)


def warm_tokenizer(tokenizer: Any, constraints: OutputConstraints) -> None:
    """What is read once per tokenizer, and the compile check's process, made ready before
    the first request, which would otherwise wait for them."""
    longest_token_bytes(tokenizer)
    constraints.warm()


def completion_budget(
    prompt_tokens: int, requested: int | None, max_model_len: int, prompt_field: str = "messages"
) -> int:
    """The max_tokens to run with; the whole remaining context when none is asked. What does
    not fit is named: ``max_tokens`` where it was asked, else the prompt's field."""
    budget = max_model_len - prompt_tokens if requested is None else requested
    if budget < 1 or prompt_tokens + budget > max_model_len:
        raise ContextLengthExceededError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + max(budget, 1)} tokens ({prompt_tokens} in the "
            f"prompt, {max(budget, 1)} for the completion). Please reduce the length of "
            "the prompt or of the completion.",
            param=prompt_field if requested is None else "max_tokens",
        )
    return budget


def sampling_params(
    request: CompletionLike,
    prompt_tokens: int,
    max_model_len: int,
    *,
    vocabulary: int | None = None,
    structured_outputs: StructuredOutputsParams | None = None,
) -> SamplingParams:
    """The engine's parameters for ``request``, with its output constraint as
    :meth:`OutputConstraints.params` checked it; ``logit_bias`` ids are checked against
    ``vocabulary`` (the tokenizer's size) where it is given."""
    bias = request.logit_bias or None
    if bias is not None and vocabulary is not None:
        outside = sorted(token for token in bias if token >= vocabulary)
        if outside:
            raise BadRequestError(
                f"Token ids in `logit_bias` must be between 0 and {vocabulary - 1}; "
                f"{outside[0]} is not.",
                param="logit_bias",
            )
    prompt_field = "messages" if isinstance(request, ChatCompletionRequest) else "prompt"
    max_tokens = completion_budget(
        prompt_tokens, request.completion_limit, max_model_len, prompt_field
    )
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
        repetition_penalty=request.repetition_penalty or 1.0,
        top_k=request.top_k or 0,
        min_p=request.min_p or 0.0,
        logprobs=request.num_logprobs,
        logit_bias=bias,
        structured_outputs=structured_outputs,
        stream_interval=request.stream_interval,
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


@dataclass
class _Choice:
    """One choice's deltas, gathered in lists: appending stays linear in the output."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[LogprobsOnePosition] | None = None
    finish_reason: str | None = None

    def add(self, delta: CompletionOutput) -> None:
        self.text.append(delta.text)
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(delta.logprobs)  # type: ignore[arg-type]
        self.finish_reason = delta.finish_reason

    def output(self, index: int) -> CompletionOutput:
        return CompletionOutput(
            index=index,
            text="".join(self.text),
            token_ids=self.token_ids,
            cumulative_logprob=None,
            logprobs=self.logprobs,
            finish_reason=self.finish_reason,
        )


async def collect(outputs: AsyncIterable[RequestOutput], n: int) -> list[CompletionOutput]:
    """Every choice's text, tokens and logprobs, by index, once the request has ended."""
    choices: dict[int, _Choice] = {}
    async for output in outputs:
        for delta in output.outputs:
            choices.setdefault(delta.index, _Choice()).add(delta)
    if len(choices) != n:
        raise EngineUnavailableError("The engine ended the request early.")
    return [choices[i].output(i) for i in sorted(choices)]
