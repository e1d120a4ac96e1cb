from __future__ import annotations

import pytest

from app.errors import BadRequestError, ContextLengthExceededError
from app.protocol import ChatCompletionRequest
from app.serving.preparation.generation import completion_budget, sampling_params


def test_completion_budget() -> None:
    assert completion_budget(10, None, 100) == 90
    assert completion_budget(10, 90, 100) == 90
    with pytest.raises(ContextLengthExceededError) as caught:
        completion_budget(10, 91, 100)
    assert "101 tokens" in caught.value.message and caught.value.param == "max_tokens"
    with pytest.raises(ContextLengthExceededError) as caught:
        completion_budget(100, None, 100)
    assert caught.value.param == "messages"  # no max_tokens asked: the prompt does not fit
    with pytest.raises(ContextLengthExceededError) as caught:
        completion_budget(100, None, 100, "prompt")
    assert caught.value.param == "prompt"


def test_sampling_params_follow_openai_defaults() -> None:
    request = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "stop": "END",
            "max_completion_tokens": 7,
            "max_tokens": 99,
        }
    )
    params = sampling_params(request, prompt_tokens=5, max_model_len=100)
    assert params.temperature == 1.0 and params.top_p == 1.0
    assert params.max_tokens == 7  # max_completion_tokens wins over the legacy field
    assert params.stop == ["END"]
    assert params.logprobs is None


def test_top_logprobs_requires_logprobs() -> None:
    with pytest.raises(ValueError, match="top_logprobs"):
        ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}
        )


def test_vllm_length_controls_pass_through() -> None:
    messages = [{"role": "user", "content": "hi"}]
    request = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": messages, "max_tokens": 8, "min_tokens": 8, "ignore_eos": True}
    )
    params = sampling_params(request, prompt_tokens=10, max_model_len=100)
    assert (params.min_tokens, params.max_tokens, params.ignore_eos) == (8, 8, True)
    too_many = request.model_copy(update={"min_tokens": 9})
    with pytest.raises(BadRequestError, match="min_tokens"):
        sampling_params(too_many, prompt_tokens=10, max_model_len=100)


def test_vllm_sampling_extensions_pass_through() -> None:
    messages = [{"role": "user", "content": "hi"}]
    request = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": messages,
            "top_k": 5,
            "min_p": 0.1,
            "repetition_penalty": 1.3,
        }
    )
    params = sampling_params(request, prompt_tokens=10, max_model_len=100)
    assert (params.top_k, params.min_p, params.repetition_penalty) == (5, 0.1, 1.3)
    default = sampling_params(
        ChatCompletionRequest.model_validate({"model": "m", "messages": messages}), 10, 100
    )
    assert (default.top_k, default.min_p, default.repetition_penalty) == (0, 0.0, 1.0)
