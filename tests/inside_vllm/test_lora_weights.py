"""A layer's stacked weights after vLLM swaps the adapter in a slot: refilled in place for
that slot when their layout holds it, stacked again when it does not, and always equal to
weights stacked from scratch (no trace of the slot's previous adapter); a slot's preparation
kept with its host-tier adapter, for as long as vLLM keeps that adapter."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from app.inside_vllm.lora_weights import LayerLoRA, PreparedLoRA

SLOTS, IN_DIM, MAX_RANK = 6, 16, 8
SLICES = (12, 8, 8)
IDS = [1, 2, 3, 4, 5, 6]


def stacks(gen: torch.Generator, ranks: list[int], touched: tuple[int, ...] = (0, 1, 2)):
    """vLLM's stacks, ``[slots, 1, ...]``, slot ``i`` at ``ranks[i]`` on the ``touched``
    slices (zeros on the others)."""
    a = tuple(torch.zeros(SLOTS, 1, MAX_RANK, IN_DIM) for _ in SLICES)
    b = tuple(torch.zeros(SLOTS, 1, size, MAX_RANK) for size in SLICES)
    for slot, rank in enumerate(ranks):
        write(gen, a, b, slot, rank, touched)
    return a, b


def write(gen, a, b, slot: int, rank: int, touched: tuple[int, ...]) -> None:
    """vLLM loading another adapter into ``slot``: the slot overwritten in place."""
    for i, (a_i, b_i) in enumerate(zip(a, b, strict=True)):
        a_i[slot] = 0
        b_i[slot] = 0
        if i in touched and rank:
            a_i[slot, 0, :rank] = torch.randn(rank, IN_DIM, generator=gen)
            b_i[slot, 0, :, :rank] = torch.randn(b_i.shape[2], rank, generator=gen)


def assert_stacked_equal(got: LayerLoRA, want: LayerLoRA) -> None:
    """The same products for every slot: each slot's ``A`` and ``B`` as stacked (the layout
    may keep more zero rank columns than a fresh stacking would)."""
    g, w = got.stacked, want.stacked
    assert [c for c, _, _ in g.expand] == [c for c, _, _ in w.expand]
    for (_, g_ranks, g_b), (_, w_ranks, w_b) in zip(g.expand, w.expand, strict=True):
        for slot in range(SLOTS):
            got_ab = g.shrink[slot][:, g_ranks] @ g_b[slot]
            want_ab = w.shrink[slot][:, w_ranks] @ w_b[slot]
            torch.testing.assert_close(got_ab, want_ab, rtol=0, atol=0)


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


SWAPS = {
    # (new adapter's rank, slices it touches): refilled in place?
    "a smaller rank": (2, (0, 1, 2), True),
    "the largest rank": (8, (0, 1, 2), True),
    "fewer slices": (4, (1,), True),
    "no slice of this layer": (0, (), True),
    "a slice no slot touched": (4, (0, 1, 2), False),
}


@pytest.mark.parametrize(("rank", "touched", "in_place"), SWAPS.values(), ids=SWAPS.keys())
def test_a_swapped_slot_is_stacked_as_from_scratch(
    gen: torch.Generator, rank: int, touched: tuple[int, ...], in_place: bool
) -> None:
    # Every slot skips slice 2, but for the last case's new adapter.
    first = (0, 1) if not in_place else (0, 1, 2)
    a, b = stacks(gen, [8, 4, 6, 2, 8, 3], first)
    prepared = PreparedLoRA()
    prepared.assign(IDS)
    before = prepared.of(a, b, SLICES)
    old_shrink = before.stacked.shrink

    write(gen, a, b, 0, rank, touched)  # slot 0 held the largest rank
    prepared.assign([11, 2, 3, 4, 5, 6])
    after = prepared.of(a, b, SLICES)

    assert (after.stacked.shrink is old_shrink) is in_place
    assert_stacked_equal(after, LayerLoRA.of(a, b, SLICES))
    # Slot 0 holds exactly its new adapter: nothing left of the old one's weights.
    assert (after.slots[0] is None) is (rank == 0)
    if rank == 0:
        assert not after.stacked.shrink[0].any()
        assert not any(stacked_b[0].any() for _, _, stacked_b in after.stacked.expand)


def test_two_swaps_in_one_step_and_a_write_no_list_announces(gen: torch.Generator) -> None:
    a, b = stacks(gen, [8, 4, 6, 2, 8, 3])
    prepared = PreparedLoRA()
    prepared.assign(IDS)
    prepared.of(a, b, SLICES).stacked  # noqa: B018 (built: a decode step batched the slots)
    write(gen, a, b, 0, 5, (0, 1, 2))
    write(gen, a, b, 5, 8, (2,))
    prepared.assign([10, 2, 3, 4, 5, 60])
    assert_stacked_equal(prepared.of(a, b, SLICES), LayerLoRA.of(a, b, SLICES))
    # The same ids, new weights (vLLM reloaded an adapter id): stacked again from scratch.
    write(gen, a, b, 2, 8, (0, 1, 2))
    assert_stacked_equal(prepared.of(a, b, SLICES), LayerLoRA.of(a, b, SLICES))


def test_a_slot_is_prepared_at_its_adapters_rank_and_an_untrained_one_adds_nothing(
    gen: torch.Generator,
) -> None:
    a, b = stacks(gen, [8, 4, 0, 2, 8, 3], touched=(0, 2))
    for b_i in b:
        b_i[4] = 0  # slot 4: an untrained adapter (PEFT starts B at zero)
    layer = LayerLoRA.of(a, b, SLICES)
    for slot, rank in enumerate([8, 4, 0, 2, 0, 3]):
        weights = layer.slots[slot]
        if not rank:
            assert weights is None
            continue
        assert weights is not None
        assert weights.shrink.shape == (IN_DIM, 2 * rank)  # slices 0 and 2, not 1
        assert [(c, r.stop - r.start) for c, r, _ in weights.expand] == [
            (slice(0, 12), rank),
            (slice(20, 28), rank),
        ]


class HostAdapter:
    """An adapter in vLLM's host tier (its ``LoRAModel``): a new object at every load."""

    def __init__(self, lora_id: int) -> None:
        self.id = lora_id


def held_in(a, b, slot: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(a_i[slot].clone(), b_i[slot].clone()) for a_i, b_i in zip(a, b, strict=True)]


def write_back(a, b, slot: int, weights: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """vLLM activating a host-tier adapter into ``slot``: its weights copied in."""
    for (a_i, b_i), (a_w, b_w) in zip(zip(a, b, strict=True), weights, strict=True):
        a_i[slot] = a_w
        b_i[slot] = b_w


def test_an_adapter_back_from_the_host_tier_keeps_its_preparation(gen: torch.Generator) -> None:
    a, b = stacks(gen, [8, 4, 6, 2, 8, 3])
    prepared = PreparedLoRA()
    first = HostAdapter(1)
    for slot, lora_id in enumerate(IDS):
        prepared.activated(slot, first if lora_id == 1 else HostAdapter(lora_id))
    prepared.assign(IDS)
    before = prepared.of(a, b, SLICES)
    weights = held_in(a, b, 0)

    write(gen, a, b, 0, 5, (0, 1, 2))  # adapter 1 leaves its slot for adapter 11
    prepared.activated(0, HostAdapter(11))
    prepared.assign([11, *IDS[1:]])
    prepared.of(a, b, SLICES).stacked  # noqa: B018 (a step batched the slots)

    write_back(a, b, 5, weights)  # and comes back from the host tier, into slot 5
    prepared.activated(5, first)
    prepared.assign([11, *IDS[1:5], 1])
    back = prepared.of(a, b, SLICES)
    assert back.slots[5] is before.slots[0]  # not prepared again
    assert_stacked_equal(back, LayerLoRA.of(a, b, SLICES))


def test_an_adapter_loaded_again_is_prepared_from_the_stacks(gen: torch.Generator) -> None:
    a, b = stacks(gen, [8, 4, 6, 2, 8, 3])
    prepared = PreparedLoRA()
    for slot, lora_id in enumerate(IDS):
        prepared.activated(slot, HostAdapter(lora_id))
    prepared.assign(IDS)
    before = prepared.of(a, b, SLICES)

    # vLLM reloads adapter 1 in place (new weights, the same id): its slot is emptied, then
    # written from the new host-tier object. Then new weights in the slot that no activation
    # announced: the stacks are what counts, not what was kept with the adapter.
    for announced in (True, False):
        if announced:
            prepared.assign([None, *IDS[1:]])
            prepared.of(a, b, SLICES)
            prepared.activated(0, HostAdapter(1))
        write(gen, a, b, 0, 7, (0, 2))
        prepared.assign(IDS)
        after = prepared.of(a, b, SLICES)
        assert after.slots[0] is not before.slots[0]
        assert_stacked_equal(after, LayerLoRA.of(a, b, SLICES))
        before = after


def test_a_preparation_goes_with_its_host_tier_adapter(gen: torch.Generator) -> None:
    a, b = stacks(gen, [8, 4, 6, 2, 8, 3])
    prepared = PreparedLoRA()
    adapter = HostAdapter(1)
    prepared.activated(0, adapter)
    prepared.assign(IDS)
    kept = weakref.ref(prepared.of(a, b, SLICES).slots[0])

    write(gen, a, b, 0, 5, (0, 1, 2))  # vLLM evicts adapter 1 from both tiers
    prepared.activated(0, HostAdapter(11))
    prepared.assign([11, *IDS[1:]])
    prepared.of(a, b, SLICES)
    del adapter
    gc.collect()
    assert kept() is None
