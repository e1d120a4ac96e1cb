"""vLLM's LoRA layers, not zeroing a slot that is zero already.

Activating an adapter in a slot, vLLM's model manager zeroes that slot in every LoRA layer
the adapter has no weights for (``reset_lora``). For adapters of the attention projections,
that is every MLP layer, the logits' ``B`` (a row per vocabulary entry) and the embedding's
``A``, zeroed at every activation although no adapter ever wrote them: on the CPU engine, a
good part of an activation's time (docs/performance-log.md).

:func:`skip_zeroing_zero_slots` makes a layer's ``reset_lora`` remember the slots it zeroed,
with the identity and version counter of each of the layer's stacks (torch moves a tensor's
counter at every in-place write, through any view of it). A slot zeroed again while no
stack has moved since is left as it is; a write of any kind (``set_lora``, or code we do not
know) moves a counter, and then no slot of that layer counts as zero until zeroed again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import wraps
from typing import Any

import torch

_ZEROED = "_lora_gateway_zeroed"
_SKIPS_ZERO_SLOTS = "__lora_gateway_skips_zero_slots__"


@dataclass
class Zeroed:
    """A layer's slots known to be zero, as long as its stacks are those of ``stamp``."""

    stamp: tuple[tuple[int, int], ...]
    slots: set[int] = field(default_factory=set)


def _stacks(layer: Any) -> Iterator[torch.Tensor]:
    for name in ("lora_a_stacked", "lora_b_stacked"):
        stacks = getattr(layer, name)
        yield from (stacks,) if isinstance(stacks, torch.Tensor) else stacks


def stamp(layer: Any) -> tuple[tuple[int, int], ...]:
    """Each stack's identity and version counter: equal stamps, no write in between."""
    return tuple((id(t), t._version) for t in _stacks(layer))


def skip_zeroing_zero_slots(layer_cls: type[Any]) -> None:
    """Wrap ``layer_cls.reset_lora``, which must zero exactly the slot's rows of its
    ``lora_a_stacked`` and ``lora_b_stacked`` (a tensor or a tuple of them), as vLLM's linear,
    logits and embedding LoRA layers do; once per class."""
    reset_lora: Callable[[Any, int], None] = layer_cls.reset_lora
    if getattr(reset_lora, _SKIPS_ZERO_SLOTS, False):
        return

    @wraps(reset_lora)
    def reset(self: Any, index: int) -> None:
        zeroed: Zeroed | None = self.__dict__.get(_ZEROED)
        now = stamp(self)
        if zeroed is not None and zeroed.stamp == now:
            if index in zeroed.slots:
                return
        else:
            zeroed = Zeroed(now)
        reset_lora(self, index)
        zeroed.stamp = stamp(self)
        zeroed.slots.add(index)
        self.__dict__[_ZEROED] = zeroed

    setattr(reset, _SKIPS_ZERO_SLOTS, True)
    layer_cls.reset_lora = reset


def install() -> None:
    """On vLLM's layers whose ``reset_lora`` zeroes their two stacks and nothing else (the
    fused MoE layer's also clears a flag, and is left as it is)."""
    from vllm.lora.layers.base_linear import BaseLinearLayerWithLoRA
    from vllm.lora.layers.logits_processor import LogitsProcessorWithLoRA
    from vllm.lora.layers.vocab_parallel_embedding import VocabParallelEmbeddingWithLoRA

    layers = (BaseLinearLayerWithLoRA, LogitsProcessorWithLoRA, VocabParallelEmbeddingWithLoRA)
    for layer_cls in layers:
        skip_zeroing_zero_slots(layer_cls)
