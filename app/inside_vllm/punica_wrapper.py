"""A CPU punica wrapper that plans each step's adapter grouping once.

vLLM's ``PunicaWrapperCPU`` hands every LoRA projection of every layer to ops that re-derive
the token-to-adapter layout on each call. :class:`PlannedPunicaWrapper` plans once per step
(:class:`RowGroups`, in ``update_metadata``): long runs of rows sharing an adapter computed
in place, many small groups as one ``bmm`` over slot-stacked weights, otherwise rows gathered
in slot order and added back with one ``index_add_``; each layer's calls bound once per plan
(:class:`Program`, :class:`StepScratch`) to weights prepared once per adapter load
(:mod:`app.inside_vllm.lora_weights`). Rows without an adapter are never touched, which keeps
the tenant isolation of :mod:`app.inside_vllm.punica_cpu`; calls that do not match the plan
fall back to those ops. Plain PyTorch on purpose (no toolchain to install); the design, the
alternatives tried and what they measured are in docs/performance-log.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial, wraps
from typing import Any

import torch
from vllm.lora.layers.utils import LoRAMapping
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

from app.inside_vllm.lora_weights import (
    HostAdapter,
    LayerLoRA,
    PreparedLoRA,
    matrices,
    used_ranks,
)

# Runs of rows sharing an adapter are computed in place, a few matmuls per run, when they
# are long on average (prefill), or hardly more than the groups: gathering and scattering
# the rows costs about as much as a couple of runs' matmuls.
MIN_RUN_ROWS = 16
EXTRA_RUNS = 2
# Many small groups (a decode step over many adapters) are batched over the span of their
# slots, one ``bmm`` per stage instead of one matmul per group, while padding every group to
# the largest at most doubles the rows. With fewer groups, gathering them was faster.
BATCHED_GROUPS = 8


@dataclass(frozen=True)
class Padded:
    """The adapter rows laid out as ``[len(slots), depth, ...]`` for one batched matmul per
    stage over that span of slots: ``where[i]`` is the i-th adapter row's place in it."""

    slots: slice
    depth: int
    where: torch.Tensor


@dataclass(frozen=True)
class Program:
    """One layer's LoRA under one plan, as calls bound to the step's buffers and the layer's
    weights: built the first time the plan meets the layer, run as is after that (on this
    engine, slicing a tensor costs about what a small matmul does). The calls read the
    gathered rows (the buffer ``x``) and leave the layer's delta for them in ``delta``."""

    calls: tuple[Callable[[], object], ...]
    delta: torch.Tensor


class StepScratch:
    """Buffers and programs that every layer reuses while the plan stands: a decode batch
    keeps its plan from step to step until a request joins or leaves."""

    def __init__(self, rows: int) -> None:
        self._rows = rows
        self._buffers: dict[tuple[str, int, torch.dtype], torch.Tensor] = {}
        self._programs: dict[tuple[int, float], tuple[LayerLoRA, Program | None]] = {}

    def buffer(
        self, name: str, width: int, like: torch.Tensor, rows: int | None = None
    ) -> torch.Tensor:
        """The ``[rows, width]`` buffer ``name`` (by default a row per adapter row), zeros
        when first made."""
        key = (name, width, like.dtype)
        buffer = self._buffers.get(key)
        if buffer is None:
            shape = (self._rows if rows is None else rows, width)
            buffer = self._buffers[key] = like.new_zeros(shape)
        return buffer

    def program(
        self, site: int, layer: LayerLoRA, scale: float, build: Callable[[], Program | None]
    ) -> Program | None:
        """The program for the layer at ``site`` (``None``: no adapter of the plan touches
        it), built again when the layer's weights changed."""
        known = self._programs.get((site, scale))
        if known is None or known[0] is not layer:
            known = self._programs[(site, scale)] = (layer, build())
        return known[1]


@dataclass(frozen=True)
class RowGroups:
    """A step's rows by adapter slot.

    ``rows`` are the batch rows that have an adapter, ordered by slot (a slice when that is
    already their order: slicing instead of index ops); each group is a slot and its range
    of ``rows``. Rows without an adapter are in no group. ``runs`` (consecutive rows sharing
    a slot, in batch order) are set when computing each run in place is cheapest, ``padded``
    when many small groups (a decode step over many adapters) are, batched; otherwise the
    groups are gathered. A plan, with its ``scratch``, stands while the rows' slots stay the same.
    """

    num_rows: int
    rows: slice | torch.Tensor
    groups: tuple[tuple[int, slice], ...]
    runs: tuple[tuple[int, slice], ...] | None = None
    padded: Padded | None = None
    scratch: StepScratch = field(default_factory=lambda: StepScratch(0), compare=False)
    slot_per_row: torch.Tensor = field(default_factory=lambda: torch.empty(0), compare=False)

    @classmethod
    def of(cls, slot_per_row: torch.Tensor, previous: RowGroups | None = None) -> RowGroups:
        """The plan for rows in these slots (``-1``: no adapter); ``previous`` itself if it
        was made for the same slots."""
        if previous is not None and torch.equal(previous.slot_per_row, slot_per_row):
            return previous
        slot_per_row = slot_per_row.clone()  # vLLM rewrites its index buffers in place
        num_rows = slot_per_row.shape[0]
        positions = torch.nonzero(slot_per_row >= 0).squeeze(1)
        if not positions.numel():
            return cls(num_rows, slice(0, 0), (), slot_per_row=slot_per_row)
        sorted_slots, order = torch.sort(slot_per_row[positions], stable=True)
        rows = positions[order]
        found, counts = torch.unique_consecutive(sorted_slots, return_counts=True)
        groups, start = [], 0
        for slot, count in zip(found.tolist(), counts.tolist(), strict=True):
            groups.append((slot, slice(start, start + count)))
            start += count
        run_slots, lengths = torch.unique_consecutive(slot_per_row, return_counts=True)
        runs, start = [], 0
        for slot, length in zip(run_slots.tolist(), lengths.tolist(), strict=True):
            if slot >= 0:
                runs.append((slot, slice(start, start + length)))
            start += length
        first, count = int(rows[0]), rows.numel()
        in_order = torch.equal(rows, torch.arange(first, first + count))
        rows_or_slice = slice(first, first + count) if in_order else rows
        plan = cls(
            num_rows,
            rows_or_slice,
            tuple(groups),
            scratch=StepScratch(count),
            slot_per_row=slot_per_row,
        )
        low, depth = groups[0][0], int(counts.max())
        span = groups[-1][0] + 1 - low
        if count >= MIN_RUN_ROWS * len(runs):
            return replace(plan, runs=tuple(runs))
        if len(groups) >= BATCHED_GROUPS and span * depth <= 2 * count:
            starts = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
            where = (sorted_slots - low) * depth + torch.arange(count) - starts
            return replace(plan, padded=Padded(slice(low, low + span), depth, where))
        if len(runs) <= len(groups) + EXTRA_RUNS:
            return replace(plan, runs=tuple(runs))
        return plan

    def gather(self, batch: torch.Tensor) -> torch.Tensor:
        """The adapter rows of ``batch``, in group order, in the step's buffer ``x``."""
        rows, out = self.rows, self.scratch.buffer("x", batch.shape[1], batch)
        if isinstance(rows, slice):
            return out.copy_(batch[rows])
        return torch.index_select(batch, 0, rows, out=out)

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
        ranks = used_ranks(stacked, rank_dim)
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
    a = matrices(a).to(x.dtype)
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
    b = matrices(b).to(y.dtype)
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
    layer: LayerLoRA,
    scale: float,
    plan: RowGroups,
    site: int,
) -> None:
    """``y[row, slice_i] += scale * x[row] @ A_i[slot].T @ B_i[slot].T`` for every adapter
    row and slice, the way the plan chose: in place per run of rows, or on the gathered rows
    (per group, or one ``bmm`` per stage over a span of slots), added back once."""
    if plan.runs is not None:
        for slot, run in plan.runs:
            if (weights := layer.slots[slot]) is not None:
                weights.add_to(y[run], x[run], scale)
        return
    program = plan.scratch.program(site, layer, scale, lambda: _program(layer, scale, plan, x))
    if program is None:
        return  # no adapter in the batch touches this layer
    plan.gather(x)
    for call in program.calls:
        call()
    plan.add_to(y[:, : layer.width] if layer.width < y.shape[1] else y, program.delta)


def _program(layer: LayerLoRA, scale: float, plan: RowGroups, x: torch.Tensor) -> Program | None:
    if all(layer.slots[slot] is None for slot, _ in plan.groups):
        return None
    return (_grouped if plan.padded is None else _batched)(layer, scale, plan, x)


def _grouped(layer: LayerLoRA, scale: float, plan: RowGroups, x: torch.Tensor) -> Program:
    """Each group of gathered rows through its slot's adapter: a matmul per stage."""
    scratch, width = plan.scratch, layer.width
    rows, delta = scratch.buffer("x", x.shape[1], x), scratch.buffer("delta", width, x)
    calls: list[Callable[[], object]] = [delta.zero_]
    for slot, group in plan.groups:
        if (weights := layer.slots[slot]) is None:
            continue
        h = scratch.buffer("h", weights.shrink.shape[1], x)[group]
        calls += weights.calls(delta[group], rows[group], h, scale)
    return Program(tuple(calls), delta)


def _batched(layer: LayerLoRA, scale: float, plan: RowGroups, x: torch.Tensor) -> Program:
    """The gathered rows laid out by slot (zero padding), one ``bmm`` per stage over the
    plan's span of slots from the layer's stacked weights, and the rows picked back out."""
    padded, scratch, width = plan.padded, plan.scratch, layer.width
    assert padded is not None
    stacked, slots = layer.stacked, padded.slots
    span, depth = slots.stop - slots.start, padded.depth
    places = span * depth
    layout = scratch.buffer("layout", x.shape[1], x, rows=places)
    h = scratch.buffer("laid-out h", stacked.shrink.shape[2], x, rows=places).view(span, depth, -1)
    # Named by the slices written: columns no slot's adapter touches stay zero.
    covered = "".join(f",{columns.start}" for columns, _, _ in stacked.expand)
    out = scratch.buffer(f"laid-out delta{covered}", width, x, rows=places)
    delta = scratch.buffer("delta", width, x)
    calls: list[Callable[[], object]] = [
        partial(layout.index_copy_, 0, padded.where, scratch.buffer("x", x.shape[1], x)),
        partial(torch.bmm, layout.view(span, depth, -1), stacked.shrink[slots], out=h),
    ]
    if scale != 1.0:
        calls.append(partial(h.mul_, scale))
    out_by_slot = out.view(span, depth, width)
    for columns, ranks, b in stacked.expand:
        if columns == slice(0, width):
            calls.append(partial(torch.bmm, h[:, :, ranks], b[slots], out=out_by_slot))
            continue
        # bmm, not baddbmm_ into the strided columns: on CPU that loops over the slots
        size = columns.stop - columns.start
        part = scratch.buffer(f"laid-out slice{size}", size, x, rows=places).view(span, depth, -1)
        calls.append(partial(torch.bmm, h[:, :, ranks], b[slots], out=part))
        calls.append(partial(out_by_slot[:, :, columns].copy_, part))
    calls.append(partial(torch.index_select, out, 0, padded.where, out=delta))
    return Program(tuple(calls), delta)


def _rows(batch: torch.Tensor) -> torch.Tensor:
    """``[..., width]`` as ``[rows, width]`` (a view; none made when it already is)."""
    return batch if batch.dim() == 2 else batch.view(-1, batch.shape[-1])


class PlannedPunicaWrapper(PunicaWrapperCPU):
    """``PunicaWrapperCPU`` with the per-step row grouping derived once (see module doc)."""

    _tokens = RowGroups(0, slice(0, 0), ())
    _requests = RowGroups(0, slice(0, 0), ())

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ranks = SlotRanks()
        self._layers = PreparedLoRA()

    def update_metadata(
        self,
        mapping: LoRAMapping,
        lora_index_to_id: list[int | None],
        max_loras: int,
        vocab_size: int,
        **kwargs: Any,
    ) -> None:
        super().update_metadata(mapping, lora_index_to_id, max_loras, vocab_size, **kwargs)
        self._layers.assign(lora_index_to_id)
        self._tokens = RowGroups.of(self.token_lora_indices, self._tokens)
        self._requests = RowGroups.of(self.sampler_indices, self._requests)

    def activated(self, slot: int, adapter: HostAdapter) -> None:
        """vLLM wrote ``adapter`` from its host tier into ``slot`` (see
        :func:`report_activations`): its prepared weights are kept with it."""
        self._layers.activated(slot, adapter)

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
        flat_x, flat_y = _rows(x), _rows(y)
        plan = self._tokens
        if not (self._fits(flat_x, plan) and self._fits(flat_y, plan)) or buffer is not None:
            super().add_lora_linear(
                y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, buffer=buffer, **kwargs
            )
            return
        if not plan.groups:
            return  # no row has an adapter
        layer = self._layers.of(lora_a_stacked, lora_b_stacked, output_slices)
        site = id(lora_a_stacked[0])  # the layer: its first stack lives as long as it does
        _lora_linear(flat_y, flat_x.to(flat_y.dtype), layer, scale, plan, site)

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
        flat_x, flat_y = _rows(x), _rows(y)
        plan = self._requests
        if not (self._fits(flat_x, plan) and self._fits(flat_y, plan)) or buffer is not None:
            super().add_lora_logits(
                y, x, lora_a_stacked, lora_b_stacked, scale, buffer=buffer, **kwargs
            )
            return
        if not plan.groups:
            return
        width = min(flat_y.shape[1], lora_b_stacked.shape[-2])
        layer = self._layers.of((lora_a_stacked,), (lora_b_stacked,), (width,))
        _lora_linear(flat_y, flat_x.to(flat_y.dtype), layer, scale, plan, id(lora_a_stacked))


_REPORTS_ACTIVATIONS = "__lora_gateway_reports_activations__"


def report_activations(manager_cls: type[Any]) -> None:
    """Make ``manager_cls.activate_adapter`` (vLLM's ``LoRAModelManager``) tell its planned
    wrappers which host-tier adapter it wrote into which slot; once per class.

    The wrapper's ``update_metadata`` sees only the slots' adapter ids, and an id can be
    loaded again with other weights (vLLM's in-place reload): the host-tier object, replaced
    on every load, is what a slot's prepared weights may be kept with.
    """
    activate_adapter: Callable[[Any, int], bool] = manager_cls.activate_adapter
    if getattr(activate_adapter, _REPORTS_ACTIVATIONS, False):
        return

    @wraps(activate_adapter)
    def activate(self: Any, lora_id: int) -> bool:
        activated: bool = activate_adapter(self, lora_id)
        if activated:
            slot = self.lora_index_to_id.index(lora_id)
            adapter = self._registered_adapters[lora_id]
            for wrapper in self.punica_wrapper_mapping.values():
                if isinstance(wrapper, PlannedPunicaWrapper):
                    wrapper.activated(slot, adapter)
        return activated

    setattr(activate, _REPORTS_ACTIVATIONS, True)
    manager_cls.activate_adapter = activate
