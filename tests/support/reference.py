"""Reference greedy decoding with transformers (+ PEFT) in float32.

The ground truth for engine tests: what a single, unbatched request to the
base model or to one adapter must produce.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class ReferenceOutput:
    """One prompt's greedy continuation.

    ``token_ids``: the generated ids (EOS is not special unless
    ``eos_token_id`` was given). ``logprobs``: log-probability of each chosen
    token, for the first ``num_logprobs`` tokens. ``margins``: for every
    generated token, the logit gap between the chosen and the runner-up token
    (small gaps flag near-ties that numerical noise may flip).
    """

    token_ids: list[int]
    logprobs: list[float]
    margins: list[float]


@functools.lru_cache(maxsize=2)
def _base_model(model_dir: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model.eval()


@torch.inference_mode()
def _greedy(
    model: torch.nn.Module,
    prompt: list[int],
    max_tokens: int,
    num_logprobs: int,
    eos_token_id: int | None,
) -> ReferenceOutput:
    input_ids = torch.tensor([prompt], dtype=torch.long)
    past = None
    token_ids: list[int] = []
    logprobs: list[float] = []
    margins: list[float] = []
    for _ in range(max_tokens):
        out = model(input_ids=input_ids, past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].float()
        top2 = torch.topk(logits, 2)
        token = int(top2.indices[0])
        token_ids.append(token)
        margins.append(float(top2.values[0] - top2.values[1]))
        if len(logprobs) < num_logprobs:
            logprobs.append(float(torch.log_softmax(logits, dim=-1)[token]))
        if eos_token_id is not None and token == eos_token_id:
            break
        input_ids = torch.tensor([[token]], dtype=torch.long)
    return ReferenceOutput(token_ids=token_ids, logprobs=logprobs, margins=margins)


def reference_greedy(
    model_dir: Path,
    adapter_dir: Path | None,
    prompts_token_ids: list[list[int]],
    max_tokens: int,
    *,
    num_logprobs: int = 5,
    eos_token_id: int | None = None,
    num_threads: int | None = 1,
) -> list[ReferenceOutput]:
    """Greedy-decode each prompt alone with the base model or ``adapter_dir``.

    Float32, batch size 1, KV cache; exactly ``max_tokens`` tokens per prompt
    unless ``eos_token_id`` is given (match with ``ignore_eos=True`` in vLLM).
    The base model is loaded once per process; an adapter is applied to a
    copy of it so the cached base stays clean. Torch runs with
    ``num_threads`` meanwhile (None: unchanged): batch-1 decoding of a small
    model gains little from more threads and slows down badly when they
    compete for shared cores.
    """
    base = _base_model(str(model_dir))
    if adapter_dir is None:
        model = base
    else:
        from peft import PeftModel

        model = PeftModel.from_pretrained(copy.deepcopy(base), str(adapter_dir)).eval()
    saved_threads = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        return [
            _greedy(model, prompt, max_tokens, num_logprobs, eos_token_id)
            for prompt in prompts_token_ids
        ]
    finally:
        torch.set_num_threads(saved_threads)
