"""The planned CPU punica wrapper against a per-row computation written from the contract,
and against vLLM's own wrapper where every row has an adapter (there vLLM is right)."""

from __future__ import annotations

import pytest
import torch
from vllm.lora.layers.utils import LoRAMapping

from app.inside_vllm.lora_weights import HostAdapter, PreparedLoRA
from app.inside_vllm.punica_wrapper import PlannedPunicaWrapper, RowGroups, report_activations

SLOTS, IN_DIM, MAX_RANK, VOCAB = 8, 24, 8, 64
SLICES = (20, 12, 12)  # a merged projection, like qkv
RANKS = (8, 4, 2, 8, 6, 8, 3, 8)  # per slot; slots also hold adapters below the max rank
LORA_IDS = [11, 12, 13, 14, 15, 16, 17, 18]  # slot i holds the adapter with this id


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def stacked(gen: torch.Generator, out_dim: int, in_dim: int, *, a: bool) -> torch.Tensor:
    """``[slots, 1, out, in]`` with each slot's rank padded by zeros, as vLLM stacks them."""
    weights = torch.zeros(SLOTS, 1, out_dim, in_dim)
    for slot, rank in enumerate(RANKS):
        if a:
            weights[slot, 0, :rank] = torch.randn(rank, in_dim, generator=gen)
        else:
            weights[slot, 0, :, :rank] = torch.randn(out_dim, rank, generator=gen)
    return weights


def wrapper(
    slot_per_token: list[int],
    *,
    requests: list[int] | None = None,
    ids: list[int] = LORA_IDS,
    planned: PlannedPunicaWrapper | None = None,
) -> PlannedPunicaWrapper:
    """A wrapper after vLLM's per-step metadata update (slot ``-1``: the base model; slot
    ``i`` holds the adapter ``ids[i]``)."""
    planned = planned or PlannedPunicaWrapper(256, 256, "cpu")
    to_id = [0 if slot < 0 else ids[slot] for slot in slot_per_token]
    prompt = to_id if requests is None else [0 if s < 0 else ids[s] for s in requests]
    mapping = LoRAMapping(tuple(to_id), tuple(prompt), is_prefill=True)
    planned.update_metadata(mapping, list(ids), SLOTS, VOCAB)
    return planned


def reference_linear(
    y: torch.Tensor,
    x: torch.Tensor,
    a: tuple[torch.Tensor, ...],
    b: tuple[torch.Tensor, ...],
    scale: float,
    slots: list[int],
) -> torch.Tensor:
    want = y.clone()
    for t, slot in enumerate(slots):
        if slot < 0:
            continue
        offset = 0
        for a_i, b_i in zip(a, b, strict=True):
            width = b_i.shape[2]
            want[t, offset : offset + width] += scale * (b_i[slot, 0] @ (a_i[slot, 0] @ x[t]))
            offset += width
    return want


BATCHES = {
    "interleaved with base rows": [0, -1, 2, 0, 1, -1, 2, 2, 3, 0],
    "contiguous segments": [1, 1, 1, -1, -1, 3, 3, 0],
    "one long prompt, short ones": [2] * 60 + [-1, 0, 3],
    "two adapters interleaved": [0, 1, -1] * 8,
    "decode over many adapters": [5, 0, 1, -1, 2, 3, 4, 5, 6, 7, -1, 1, 7],
    "one adapter": [2] * 6,
    "base model only": [-1] * 5,
}


@pytest.mark.parametrize("slots", BATCHES.values(), ids=BATCHES.keys())
def test_lora_linear_matches_the_per_row_contract(gen: torch.Generator, slots: list[int]) -> None:
    a = tuple(stacked(gen, MAX_RANK, IN_DIM, a=True) for _ in SLICES)
    b = tuple(stacked(gen, size, MAX_RANK, a=False) for size in SLICES)
    x = torch.randn(len(slots), IN_DIM, generator=gen)
    y = torch.randn(len(slots), sum(SLICES), generator=gen)
    want = reference_linear(y, x, a, b, 0.5, slots)
    wrapper(slots).add_lora_linear(y, x, a, b, 0.5, SLICES)
    torch.testing.assert_close(y, want)
    base_rows = [t for t, slot in enumerate(slots) if slot < 0]
    assert torch.equal(y[base_rows], want[base_rows])  # bit for bit: never touched


@pytest.mark.parametrize("slots", BATCHES.values(), ids=BATCHES.keys())
def test_every_layer_of_a_step_matches_the_contract(gen: torch.Generator, slots: list[int]) -> None:
    """Layers share a plan's buffers, and a plan stands while the slots do: layers of other
    widths, one whose middle slice some adapters skip, the same shapes again, and the next
    step with new inputs must not see each other's rows."""
    skipping_k = (SLICES, {1: (3, 5)})  # slots 3 and 5 leave the middle slice alone
    shapes = [(SLICES, {}), ((IN_DIM,), {}), skipping_k, (SLICES, {}), ((IN_DIM,), {})]
    layers = []
    for slices, skipped in shapes:
        a = tuple(stacked(gen, MAX_RANK, IN_DIM, a=True) for _ in slices)
        b = tuple(stacked(gen, size, MAX_RANK, a=False) for size in slices)
        for index, skipping in skipped.items():
            a[index][list(skipping)] = 0
            b[index][list(skipping)] = 0
        layers.append((a, b, slices))
    planned = wrapper(slots)
    plan = planned._tokens
    for _step in range(2):
        for a, b, slices in layers:
            x = torch.randn(len(slots), IN_DIM, generator=gen)
            y = torch.randn(len(slots), sum(slices), generator=gen)
            want = reference_linear(y, x, a, b, 0.5, slots)
            planned.add_lora_linear(y, x, a, b, 0.5, slices)
            torch.testing.assert_close(y, want)
        wrapper(slots, planned=planned)  # the next step: same slots, same plan
        assert planned._tokens is plan
    wrapper([*slots[1:], slots[0]], planned=planned)
    assert planned._tokens is not plan or len(set(slots)) == 1


@pytest.mark.parametrize("slots", BATCHES.values(), ids=BATCHES.keys())
def test_shrink_then_expand_matches_the_per_row_contract(
    gen: torch.Generator, slots: list[int]
) -> None:
    """The path vLLM's row-parallel layers take: a float32 buffer, shrink, then expand."""
    a = tuple(stacked(gen, MAX_RANK, IN_DIM, a=True) for _ in SLICES)
    b = tuple(stacked(gen, size, MAX_RANK, a=False) for size in SLICES)
    x = torch.randn(len(slots), IN_DIM, generator=gen)
    y = torch.randn(len(slots), sum(SLICES), generator=gen)
    want = reference_linear(y, x, a, b, 1.0, slots)
    planned = wrapper(slots)
    buffer = torch.full((len(SLICES), len(slots), MAX_RANK), float("nan"))
    planned.add_shrink(buffer, x, a, 1.0)
    assert not buffer.isnan().any()  # base rows read zeros
    planned.add_expand(y, buffer, b, SLICES, offset_start=0, add_inputs=True)
    torch.testing.assert_close(y, want)


@pytest.mark.parametrize("announced", [True, False], ids=["new adapter ids", "same ids"])
def test_weights_written_into_a_slot_are_used_at_once(
    gen: torch.Generator, announced: bool
) -> None:
    """vLLM loads an adapter by writing into the stacks in place, then passes the new
    slot-to-adapter list; a slot whose adapter skips the layer holds zeros there. The
    weights each slot uses must follow at once, even a write no new list announces."""
    slots = BATCHES["interleaved with base rows"]
    a = tuple(stacked(gen, MAX_RANK, IN_DIM, a=True) for _ in SLICES)
    b = tuple(stacked(gen, size, MAX_RANK, a=False) for size in SLICES)
    x = torch.randn(len(slots), IN_DIM, generator=gen)
    planned = wrapper(slots)
    planned.add_lora_linear(torch.zeros(len(slots), sum(SLICES)), x, a, b, 1.0, SLICES)

    for a_i, b_i in zip(a, b, strict=True):
        a_i[2] = 0  # slot 2's new adapter does not touch this layer
        b_i[2] = 0
        a_i[1, 0] = torch.randn(MAX_RANK, IN_DIM, generator=gen)  # slot 1's: the full rank
        b_i[1, 0] = torch.randn(b_i.shape[2], MAX_RANK, generator=gen)
    if announced:
        wrapper(slots, ids=[11, 21, 22, *LORA_IDS[3:]], planned=planned)
    y = torch.randn(len(slots), sum(SLICES), generator=gen)
    want = reference_linear(y, x, a, b, 1.0, slots)
    planned.add_lora_linear(y, x, a, b, 1.0, SLICES)
    torch.testing.assert_close(y, want)
    slot_two = [t for t, slot in enumerate(slots) if slot == 2]
    assert torch.equal(y[slot_two], want[slot_two])


def test_embedding_expands_only_adapter_rows(gen: torch.Generator) -> None:
    slots = BATCHES["interleaved with base rows"]
    b = stacked(gen, 16, MAX_RANK, a=False)
    x = torch.randn(len(slots), MAX_RANK, generator=gen)
    y = torch.randn(len(slots), 16, generator=gen)
    want = y.clone()
    for t, slot in enumerate(slots):
        if slot >= 0:
            want[t] += b[slot, 0] @ x[t]
    wrapper(slots).add_lora_embedding(y, x, b, add_inputs=True)
    torch.testing.assert_close(y, want)


def test_logits_follow_the_per_request_slots(gen: torch.Generator) -> None:
    """Prefill: five prompt tokens, but logits for the two requests' last tokens only."""
    tokens, requests = [1, 1, 1, -1, -1], [1, -1]
    a = stacked(gen, MAX_RANK, IN_DIM, a=True)
    b = stacked(gen, VOCAB, MAX_RANK, a=False)
    x = torch.randn(2, IN_DIM, generator=gen)
    y = torch.randn(2, VOCAB, generator=gen)
    want = reference_linear(y, x, (a,), (b,), 1.0, requests)
    wrapper(tokens, requests=requests).add_lora_logits(y, x, a, b, 1.0)
    torch.testing.assert_close(y, want)


def test_row_groups_order_adapter_rows_by_slot() -> None:
    plan = RowGroups.of(torch.tensor([3, 3, -1, 1, 3, 1]))
    assert plan.num_rows == 6
    assert torch.equal(torch.as_tensor(plan.rows), torch.tensor([3, 5, 0, 1, 4]))
    assert plan.groups == ((1, slice(0, 2)), (3, slice(2, 5)))
    # rows already in slot order are a slice: no gather, no scatter
    contiguous = RowGroups.of(torch.tensor([-1, 0, 0, 2, -1]))
    assert contiguous.rows == slice(1, 4)
    assert contiguous.groups == ((0, slice(0, 2)), (2, slice(2, 3)))
    assert RowGroups.of(torch.tensor([-1, -1])).groups == ()


def test_runs_are_computed_in_place_when_long_or_few() -> None:
    prefill = RowGroups.of(torch.tensor(BATCHES["one long prompt, short ones"]))
    assert prefill.runs == ((2, slice(0, 60)), (0, slice(61, 62)), (3, slice(62, 63)))
    segments = RowGroups.of(torch.tensor(BATCHES["contiguous segments"]))
    assert segments.runs == ((1, slice(0, 3)), (3, slice(5, 7)), (0, slice(7, 8)))
    # decode: short runs, many more than the adapters: gathered by slot instead
    for name in ("interleaved with base rows", "two adapters interleaved"):
        plan = RowGroups.of(torch.tensor(BATCHES[name]))
        assert plan.runs is None and plan.padded is None


def test_many_small_groups_are_batched_over_their_slots() -> None:
    """A decode step over many adapters: one bmm per stage beats one matmul per adapter."""
    decode = RowGroups.of(torch.tensor(BATCHES["decode over many adapters"]))
    assert decode.runs is None and decode.padded is not None
    assert (decode.padded.slots, decode.padded.depth) == (slice(0, 8), 2)
    # each adapter row's place in the [slots, depth] layout, rows in slot order
    assert decode.padded.where.tolist() == [0, 2, 3, 4, 6, 8, 10, 11, 12, 14, 15]
    # one deep group would pad the others' rows to its depth: gathered instead
    lopsided = RowGroups.of(torch.tensor([0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 7]))
    assert lopsided.padded is None and lopsided.runs is None


def test_a_swap_prepares_only_the_swapped_slot(gen: torch.Generator) -> None:
    a = tuple(stacked(gen, MAX_RANK, IN_DIM, a=True) for _ in SLICES)
    b = tuple(stacked(gen, size, MAX_RANK, a=False) for size in SLICES)
    prepared = PreparedLoRA()
    prepared.assign(LORA_IDS)
    before = prepared.of(a, b, SLICES)
    assert prepared.of(a, b, SLICES) is before  # the stacks did not move: nothing to do
    assert [s.shrink.shape[1] for s in before.slots if s] == [3 * r for r in RANKS]

    for a_i, b_i in zip(a, b, strict=True):  # vLLM loads another adapter into slot 1
        a_i[1, 0] = torch.randn(MAX_RANK, IN_DIM, generator=gen)
        b_i[1, 0] = torch.randn(b_i.shape[2], MAX_RANK, generator=gen)
    prepared.assign([11, 99, *LORA_IDS[2:]])
    after = prepared.of(a, b, SLICES)
    assert [after.slots[s] is before.slots[s] for s in range(SLOTS)] == [s != 1 for s in range(8)]
    assert after.slots[1] is not None and after.slots[1].shrink.shape[1] == 3 * MAX_RANK


class Recording(PlannedPunicaWrapper):
    def __init__(self) -> None:
        super().__init__(256, 256, "cpu")
        self.seen: list[tuple[int, object]] = []

    def activated(self, slot: int, adapter: HostAdapter) -> None:
        self.seen.append((slot, adapter))


def test_the_model_manager_reports_what_it_activates_where() -> None:
    class Manager:
        """vLLM's ``LoRAModelManager`` as far as activating goes."""

        def __init__(self) -> None:
            self.lora_index_to_id: list[int | None] = [None, None]
            self._registered_adapters = {7: object(), 9: object()}
            self.wrapper = Recording()
            self.punica_wrapper_mapping = {"language_model": self.wrapper}

        def activate_adapter(self, lora_id: int) -> bool:
            if lora_id in self.lora_index_to_id:
                return False
            self.lora_index_to_id[self.lora_index_to_id.index(None)] = lora_id
            return True

    report_activations(Manager)
    report_activations(Manager)  # once
    manager = Manager()
    assert [manager.activate_adapter(i) for i in (9, 7, 9)] == [True, True, False]
    assert manager.wrapper.seen == [
        (0, manager._registered_adapters[9]),
        (1, manager._registered_adapters[7]),
    ]
