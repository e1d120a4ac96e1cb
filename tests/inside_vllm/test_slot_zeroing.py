"""A slot is zeroed again only when something may have written it since it was zeroed."""

from __future__ import annotations

import pytest
import torch
from vllm.lora.layers.base_linear import BaseLinearLayerWithLoRA
from vllm.lora.layers.logits_processor import LogitsProcessorWithLoRA
from vllm.lora.layers.vocab_parallel_embedding import VocabParallelEmbeddingWithLoRA

from app.inside_vllm import slot_zeroing

SLOTS = 3


@pytest.fixture(scope="module", autouse=True)
def installed() -> None:
    slot_zeroing.install()
    slot_zeroing.install()  # once


def linear_layer() -> BaseLinearLayerWithLoRA:
    """vLLM's merged-projection layer as far as its stacks go: two slices."""
    layer = BaseLinearLayerWithLoRA.__new__(BaseLinearLayerWithLoRA)
    torch.nn.Module.__init__(layer)
    layer.n_slices = 2
    layer.lora_a_stacked = tuple(torch.zeros(SLOTS, 1, 4, 6) for _ in range(2))
    layer.lora_b_stacked = tuple(torch.zeros(SLOTS, 1, 6, 4) for _ in range(2))
    return layer


def logits_layer() -> LogitsProcessorWithLoRA:
    layer = LogitsProcessorWithLoRA.__new__(LogitsProcessorWithLoRA)
    torch.nn.Module.__init__(layer)
    layer.lora_a_stacked = torch.zeros(SLOTS, 1, 4, 6)
    layer.lora_b_stacked = torch.zeros(SLOTS, 1, 10, 4)
    return layer


def fill(layer: object, slot: int) -> None:
    for stack in slot_zeroing._stacks(layer):
        stack[slot] = 1.0


def is_zero(layer: object, slot: int) -> bool:
    return all(not stack[slot].any() for stack in slot_zeroing._stacks(layer))


@pytest.mark.parametrize("make", [linear_layer, logits_layer])
def test_a_slot_zeroed_and_untouched_since_is_not_zeroed_again(make) -> None:  # type: ignore[no-untyped-def]
    layer = make()
    fill(layer, 1)
    layer.reset_lora(1)
    assert is_zero(layer, 1)
    before = slot_zeroing.stamp(layer)
    layer.reset_lora(1)
    layer.reset_lora(1)
    assert slot_zeroing.stamp(layer) == before  # no write at all


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(lambda layer: fill(layer, 1), id="the slot itself"),
        pytest.param(lambda layer: fill(layer, 2), id="another slot"),
        pytest.param(
            lambda layer: slot_zeroing._stacks(layer).__next__()[1, 0, :2].add_(3.0),
            id="part of the slot, through a view",
        ),
    ],
)
def test_any_write_since_makes_the_next_reset_zero_the_slot(write) -> None:  # type: ignore[no-untyped-def]
    layer = linear_layer()
    layer.reset_lora(1)
    write(layer)
    layer.reset_lora(1)
    assert is_zero(layer, 1)


def test_a_stack_replaced_by_another_tensor_is_zeroed() -> None:
    layer = logits_layer()
    layer.reset_lora(0)
    written = torch.ones(SLOTS, 1, 10, 4)
    while written._version < layer.lora_b_stacked._version:
        written.mul_(1.0)
    assert written._version == layer.lora_b_stacked._version  # only identity tells them apart
    layer.lora_b_stacked = written
    layer.reset_lora(0)
    assert is_zero(layer, 0)


def test_set_lora_then_reset_zeroes_the_slot() -> None:
    """vLLM's own write path: ``set_lora`` zeroes (skipped here: the slot is zero) and
    copies the adapter's ranks; the next occupant's reset must zero them."""
    layer = logits_layer()
    layer.reset_lora(2)
    layer.set_lora(2, torch.ones(2, 6), torch.ones(10, 2))
    assert layer.lora_a_stacked[2, 0, :2].all() and not layer.lora_a_stacked[2, 0, 2:].any()
    layer.reset_lora(2)
    assert is_zero(layer, 2)


def test_vllms_three_layer_kinds_are_wrapped() -> None:
    layers = (BaseLinearLayerWithLoRA, LogitsProcessorWithLoRA, VocabParallelEmbeddingWithLoRA)
    for layer_cls in layers:
        assert layer_cls.__dict__["reset_lora"].__wrapped__.__qualname__ == (
            f"{layer_cls.__name__}.reset_lora"
        )
