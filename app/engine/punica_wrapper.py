"""A CPU punica wrapper that plans each step's adapter grouping once.

vLLM's ``PunicaWrapperCPU`` hands every LoRA projection of every layer (about
120 calls per step for the embedded model, each with up to three slices) to
free-function ops that re-derive the token-to-adapter layout from index
tensors: upstream by gathering a copy of the adapter weights for every token,
our isolation-fixed ops (:mod:`app.engine.punica_cpu`) by grouping the rows
again on each call. Since vLLM 0.32 always takes the segmented (``sgmv``)
path, a decode batch whose adapters interleave becomes one segment, hence one
matmul, per token.

:class:`PlannedPunicaWrapper` plans once per step, in ``update_metadata``
(:class:`RowGroups`), and every projection follows the plan:

* few long runs of rows sharing an adapter (prefill: one per prompt): each run
  is computed in place, one matmul per run and stage, no gather or scatter;
* many small groups (a decode step over many adapters): one ``bmm`` per stage
  over every slot, the rows laid out ``[slots, depth]``;
* otherwise the adapter rows are gathered in slot order, one matmul per
  adapter, and added back with one ``index_add_``.

:class:`SlotRanks` skips the zeros vLLM pads with: rank beyond an adapter's
own, and layers an adapter does not target. Rows without an adapter (slot
``-1``) are never touched, which keeps the tenant isolation of
:mod:`app.engine.punica_cpu`. Calls whose row count does not match the plan
(vLLM pads or broadcasts rows in a few paths) fall back to vLLM's wrapper
methods, which the plugin has pointed at those ops.

Plain PyTorch on purpose: each matmul is oneDNN's GEMM, which a hand-written
kernel would not beat for these shapes, and a compiled extension would cost
every install a toolchain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from vllm.lora.layers.utils import LoRAMapping
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

# One matmul call costs about as much as this many rows of LoRA arithmetic: batching every
# slot (slots x largest group rows, padded) pays while it computes fewer extra rows than
# the calls it saves.
ROWS_PER_CALL = 16


@dataclass(frozen=True)
class Padded:
    """The adapter rows laid out as ``[slots, depth, ...]`` for one batched matmul per
    stage: ``where[i]`` is the i-th adapter row's place in that layout."""

    slots: int
    depth: int
    where: torch.Tensor


@dataclass(frozen=True)
class RowGroups:
    """A step's rows by adapter slot.

    ``rows`` are the batch rows that have an adapter, ordered by slot (a slice when that is
    already their order, so no copy is made); each group is a slot and its range of ``rows``.
    Rows without an adapter are in no group. ``padded`` is set when many small groups (a
    decode step over many adapters) are cheaper as one batched matmul over all slots than
    as one matmul per group.
    """

    num_rows: int
    rows: slice | torch.Tensor
    groups: tuple[tuple[int, slice], ...]
    padded: Padded | None = None
    # Runs of consecutive rows sharing a slot, in batch order (prefill: one per prompt), when
    # there are few enough to compute each in place, with no gather and no scatter.
    runs: tuple[tuple[int, slice], ...] | None = None

    @classmethod
    def of(cls, slot_per_row: torch.Tensor, slots: int = 0) -> RowGroups:
        num_rows = slot_per_row.shape[0]
        positions = torch.nonzero(slot_per_row >= 0).squeeze(1)
        if not positions.numel():
            return cls(num_rows, slice(0, 0), ())
        sorted_slots, order = torch.sort(slot_per_row[positions], stable=True)
        rows = positions[order]
        found, counts = torch.unique_consecutive(sorted_slots, return_counts=True)
        groups, start = [], 0
        for slot, count in zip(found.tolist(), counts.tolist(), strict=True):
            groups.append((slot, slice(start, start + count)))
            start += count
        padded = None
        depth = int(counts.max())
        if len(groups) > 2 and slots * depth <= rows.numel() + ROWS_PER_CALL * len(groups):
            starts = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
            rank_in_group = torch.arange(rows.numel()) - starts
            padded = Padded(slots, depth, sorted_slots * depth + rank_in_group)
        runs = None
        if padded is None:
            run_slots, lengths = torch.unique_consecutive(slot_per_row, return_counts=True)
            if len(run_slots) <= 2 * len(groups):
                runs, start = [], 0
                for slot, length in zip(run_slots.tolist(), lengths.tolist(), strict=True):
                    if slot >= 0:
                        runs.append((slot, slice(start, start + length)))
                    start += length
        first, count = int(rows[0]), rows.numel()
        in_order = torch.equal(rows, torch.arange(first, first + count))
        chosen = slice(first, first + count) if in_order else rows
        return cls(num_rows, chosen, tuple(groups), padded, None if runs is None else tuple(runs))

    def gather(self, batch: torch.Tensor) -> torch.Tensor:
        """The adapter rows of ``batch``, in group order."""
        rows = self.rows
        return batch[rows] if isinstance(rows, slice) else batch.index_select(0, rows)

    def add_to(self, batch: torch.Tensor, grouped: torch.Tensor) -> None:
        """``batch[row] += grouped[i]`` for the i-th adapter row; other rows untouched."""
        rows = self.rows
        if isinstance(rows, slice):
            batch[rows] += grouped
        else:
            batch.index_add_(0, rows, grouped)

    def put_into(self, batch: torch.Tensor, grouped: torch.Tensor) -> None:
        """``batch[row] = grouped[i]`` for the i-th adapter row; other rows untouched."""
        rows = self.rows
        if isinstance(rows, slice):
            batch[rows] = grouped
        else:
            batch.index_copy_(0, rows, grouped)


def _matrices(stacked: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[slots, 1, out, in]`` -> ``[slots, out, in]`` (a view unless cast)."""
    matrices = stacked.squeeze(1) if stacked.dim() == 4 else stacked
    return matrices.to(dtype)


class SlotRanks:
    """Per stacked LoRA weight and slot, the rank actually used: how many leading rank rows
    (A) or columns (B) are not all zero; 0 where the slot's adapter does not touch the layer.

    vLLM pads every adapter to ``max_lora_rank`` and gives a layer an adapter skips all-zero
    weights; multiplying by those zeros is most of the cost of small-rank or attention-only
    adapters. Computed once per weight version: vLLM writes the stacks in place when it loads
    an adapter into a slot, which bumps the tensor's version counter.
    """

    def __init__(self) -> None:
        self._known: dict[int, tuple[torch.Tensor, int, list[int]]] = {}

    def of(self, stacked: torch.Tensor, rank_dim: int) -> list[int]:
        known = self._known.get(id(stacked))
        if known is not None and known[0] is stacked and known[1] == stacked._version:
            return known[2]
        matrices = stacked.squeeze(1) if stacked.dim() == 4 else stacked
        other = 2 if rank_dim == 1 else 1
        used = matrices.ne(0).any(dim=other)  # [slots, max_rank]
        positions = torch.arange(1, used.shape[1] + 1)
        ranks = (used * positions).amax(dim=1).tolist()
        self._known[id(stacked)] = (stacked, stacked._version, ranks)
        return ranks

    def of_a(self, stacked: torch.Tensor) -> list[int]:
        """``A``: ``[slots, (1,) rank, in]``."""
        return self.of(stacked, rank_dim=1)

    def of_b(self, stacked: torch.Tensor) -> list[int]:
        """``B``: ``[slots, (1,) out, rank]``."""
        return self.of(stacked, rank_dim=2)


def _shrink(
    out: torch.Tensor,
    x: torch.Tensor,
    a: torch.Tensor,
    plan: RowGroups,
    scale: float,
    ranks: SlotRanks,
) -> None:
    """``out[row, :rank] = scale * x[row] @ A[slot].T`` for every adapter row."""
    slot_ranks = ranks.of_a(a)
    a = _matrices(a, x.dtype)
    xs = plan.gather(x)
    h = xs.new_zeros(xs.shape[0], a.shape[1])
    for slot, group in plan.groups:
        if rank := slot_ranks[slot]:
            torch.mm(xs[group], a[slot, :rank].t(), out=h[group, :rank])
    if scale != 1.0:
        h.mul_(scale)
    plan.put_into(out[:, : a.shape[1]], h.to(out.dtype))


def _expand(
    y: torch.Tensor,
    h: torch.Tensor,
    b: torch.Tensor,
    plan: RowGroups,
    offset: int,
    size: int,
    add_inputs: bool,
    ranks: SlotRanks,
) -> None:
    """``y[row, offset:offset+size] (+)= h[row] @ B[slot].T`` for every adapter row."""
    slot_ranks = ranks.of_b(b)
    if add_inputs and not any(slot_ranks[slot] for slot, _ in plan.groups):
        return
    b = _matrices(b, y.dtype)
    size = min(size, b.shape[1], y.shape[1] - offset)
    hs = plan.gather(h).to(y.dtype)
    delta = y.new_zeros(hs.shape[0], size)
    for slot, group in plan.groups:
        if rank := slot_ranks[slot]:
            torch.mm(hs[group, :rank], b[slot, :size, :rank].t(), out=delta[group])
    cols = y[:, offset : offset + size]
    (plan.add_to if add_inputs else plan.put_into)(cols, delta)


def _lora_linear(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: Sequence[torch.Tensor],
    lora_b: Sequence[torch.Tensor],
    scale: float,
    output_slices: Sequence[int],
    plan: RowGroups,
    ranks: SlotRanks,
) -> None:
    """``y[row, slice_i] += scale * x[row] @ A_i[slot].T @ B_i[slot].T`` for every adapter
    row and slice, the way the plan chose: in place per run of rows (prefill), one ``bmm``
    per stage over every slot (many small groups), or per group of gathered rows, added
    back once."""
    slot_ranks = [ranks.of_a(t) for t in lora_a]
    if not any(r[slot] for r in slot_ranks for slot, _ in plan.groups):
        return  # no adapter in the batch touches this layer
    a = [_matrices(t, y.dtype) for t in lora_a]
    b = [_matrices(t, y.dtype) for t in lora_b]
    if plan.runs is not None:
        for slot, run in plan.runs:
            _add_lora(y[run], x[run].to(y.dtype), slot, a, b, slot_ranks, output_slices, scale)
        return
    xs = plan.gather(x).to(y.dtype)
    width = sum(output_slices)
    if plan.padded is not None and plan.padded.slots == a[0].shape[0]:
        # Every slot's weights are read: only up to the largest rank any slot uses.
        a = [a_i[:, : max(r_i)] for a_i, r_i in zip(a, slot_ranks, strict=True)]
        b = [b_i[:, :, : max(r_i)] for b_i, r_i in zip(b, slot_ranks, strict=True)]
        delta = _batched_lora(xs, a, b, scale, output_slices, plan.padded)
    else:
        delta = y.new_zeros(xs.shape[0], width)
        for slot, group in plan.groups:
            _add_lora(delta[group], xs[group], slot, a, b, slot_ranks, output_slices, scale)
    plan.add_to(y[:, :width], delta)


def _add_lora(
    out: torch.Tensor,
    rows: torch.Tensor,
    slot: int,
    a: Sequence[torch.Tensor],
    b: Sequence[torch.Tensor],
    slot_ranks: Sequence[list[int]],
    output_slices: Sequence[int],
    scale: float,
) -> None:
    """``out[:, slice_i] += scale * rows @ A_i[slot].T @ B_i[slot].T`` for every slice, in
    place, at the slot's own rank per slice (none where it is 0)."""
    offset = 0
    for a_i, b_i, r_i, size in zip(a, b, slot_ranks, output_slices, strict=True):
        if rank := r_i[slot]:
            h = torch.mm(rows, a_i[slot, :rank].t())
            if scale != 1.0:
                h.mul_(scale)
            out[:, offset : offset + size].addmm_(h, b_i[slot, :size, :rank].t())
        offset += size


def _batched_lora(
    xs: torch.Tensor,
    a: Sequence[torch.Tensor],
    b: Sequence[torch.Tensor],
    scale: float,
    output_slices: Sequence[int],
    padded: Padded,
) -> torch.Tensor:
    """Every slot at once: ``[slots, depth, in]`` through the stacked weights with one
    ``bmm`` per stage and slice. Slots without rows (or without weights) multiply zeros."""
    layout = xs.new_zeros(padded.slots * padded.depth, xs.shape[1])
    layout.index_copy_(0, padded.where, xs)
    layout = layout.view(padded.slots, padded.depth, -1)
    deltas = []
    for a_i, b_i, size in zip(a, b, output_slices, strict=True):
        h = torch.bmm(layout, a_i.transpose(1, 2))
        if scale != 1.0:
            h.mul_(scale)
        out = torch.bmm(h, b_i[:, :size].transpose(1, 2))
        deltas.append(out.view(padded.slots * padded.depth, size))
    grouped = deltas[0] if len(deltas) == 1 else torch.cat(deltas, dim=1)
    return grouped.index_select(0, padded.where)


class PlannedPunicaWrapper(PunicaWrapperCPU):
    """``PunicaWrapperCPU`` with the per-step row grouping derived once (see module doc)."""

    _tokens = RowGroups(0, slice(0, 0), ())
    _requests = RowGroups(0, slice(0, 0), ())

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ranks = SlotRanks()

    def update_metadata(
        self,
        mapping: LoRAMapping,
        lora_index_to_id: list[int | None],
        max_loras: int,
        vocab_size: int,
        **kwargs: Any,
    ) -> None:
        super().update_metadata(mapping, lora_index_to_id, max_loras, vocab_size, **kwargs)
        self._tokens = RowGroups.of(self.token_lora_indices, max_loras)
        self._requests = RowGroups.of(self.sampler_indices, max_loras)

    def _fits(self, x: torch.Tensor, plan: RowGroups) -> bool:
        return x.shape[0] == plan.num_rows

    def add_shrink(
        self,
        y: tuple[torch.Tensor, ...] | torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: tuple[torch.Tensor, ...],
        scale: float,
        **kwargs: Any,
    ) -> None:
        x = x.view(-1, x.shape[-1])
        if not self._fits(x, self._tokens):
            super().add_shrink(y, x, lora_a_stacked, scale, **kwargs)
            return
        for out, a in zip(y, lora_a_stacked, strict=True):
            out = out.view(-1, out.shape[-1])
            out.zero_()  # rows without an adapter read zeros, as upstream's contract says
            _shrink(out, x, a, self._tokens, scale, self._ranks)

    def add_expand(
        self,
        y: torch.Tensor,
        x: tuple[torch.Tensor, ...] | torch.Tensor,
        lora_b_stacked: tuple[torch.Tensor, ...],
        output_slices: tuple[int, ...],
        offset_start: int = 0,
        add_inputs: bool = True,
        **kwargs: Any,
    ) -> None:
        flat = y.view(-1, y.shape[-1])
        if not self._fits(flat, self._tokens) or any(
            not self._fits(h.view(-1, h.shape[-1]), self._tokens) for h in x
        ):
            super().add_expand(
                y, x, lora_b_stacked, output_slices, offset_start, add_inputs, **kwargs
            )
            return
        offset = offset_start
        for h, b, size in zip(x, lora_b_stacked, output_slices, strict=True):
            h = h.view(-1, h.shape[-1])
            _expand(flat, h, b, self._tokens, offset, size, add_inputs, self._ranks)
            offset += size

    def add_lora_embedding(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_b_stacked: torch.Tensor,
        add_inputs: bool = True,
        **kwargs: Any,
    ) -> None:
        if not (self._fits(x, self._tokens) and self._fits(y, self._tokens)):
            super().add_lora_embedding(y, x, lora_b_stacked, add_inputs, **kwargs)
            return
        _expand(y, x, lora_b_stacked, self._tokens, 0, y.shape[1], add_inputs, self._ranks)

    def add_lora_linear(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: tuple[torch.Tensor, ...],
        lora_b_stacked: tuple[torch.Tensor, ...],
        scale: float,
        output_slices: tuple[int, ...],
        *,
        buffer: tuple[torch.Tensor, ...] | None = None,
        **kwargs: Any,
    ) -> None:
        flat_x = x.view(-1, x.shape[-1])
        flat_y = y.view(-1, y.shape[-1])
        plan = self._tokens
        if not (self._fits(flat_x, plan) and self._fits(flat_y, plan)) or buffer is not None:
            super().add_lora_linear(
                y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, buffer=buffer, **kwargs
            )
            return
        _lora_linear(
            flat_y, flat_x, lora_a_stacked, lora_b_stacked, scale, output_slices, plan, self._ranks
        )

    def add_lora_logits(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: torch.Tensor,
        lora_b_stacked: torch.Tensor,
        scale: float,
        *,
        buffer: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> None:
        flat_x = x.view(-1, x.shape[-1])
        flat_y = y.view(-1, y.shape[-1])
        plan = self._requests
        if not (self._fits(flat_x, plan) and self._fits(flat_y, plan)) or buffer is not None:
            super().add_lora_logits(
                y, x, lora_a_stacked, lora_b_stacked, scale, buffer=buffer, **kwargs
            )
            return
        width = min(flat_y.shape[1], lora_b_stacked.shape[-2])
        _lora_linear(
            flat_y, flat_x, (lora_a_stacked,), (lora_b_stacked,), scale, (width,), plan, self._ranks
        )
