"""A layer's resident adapters, laid out once for plain matmuls.

vLLM keeps each LoRA layer's weights as one stack per output slice (merged qkv has three,
gate_up two): ``A: [slots, 1, max_rank, in]`` and ``B: [slots, 1, out, max_rank]``, every
adapter zero-padded to ``max_lora_rank``, and all zeros where a slot's adapter skips the
layer. Multiplying straight from those stacks costs, on every call, a few view ops per slot
and slice plus the arithmetic on the padding; on the CPU engine that overhead, not the
arithmetic, was most of what LoRA added to a decode step.

:class:`LayerLoRA` is the same weights prepared once per adapter load: per slot, every
slice's ``A`` transposed side by side at the adapter's own rank (one matmul shrinks for all
slices) and each slice's ``B`` transposed (one ``addmm_`` per slice, in place), plus, the
first time a step batches many adapters, every slot stacked for ``bmm``
(:class:`StackedLoRA`). :class:`PreparedLoRA` keeps one per layer and prepares a slot again
when vLLM loads another adapter into it, writing it into the stacked weights in place
rather than stacking every slot again. A slot's preparation is kept with the host-tier
adapter it came from, so an adapter that leaves its slot and comes back from vLLM's host
cache is prepared once per host-tier load, not once per slot change.

Slots never mix: a slot's weights only ever multiply rows of that slot (batched: its rows
and zero padding), so a request is computed with its own adapter or none.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

# (columns of the layer's output, columns of the shrunk rows, B transposed: [rank, size])
Expansion = tuple[slice, slice, torch.Tensor]


def used_ranks(stacked: torch.Tensor, rank_dim: int) -> list[int]:
    """Per slot, how many leading rank rows (``A``, ``rank_dim=1``) or columns (``B``,
    ``rank_dim=2``) of a ``[slots, (1,) ., .]`` stack are not all zero."""
    return [_used_rank(m, dim=1 if rank_dim == 1 else 0) for m in matrices(stacked)]


def _used_rank(matrix: torch.Tensor, dim: int) -> int:
    """How many leading rows (``dim=1``: reduce along columns) or columns (``dim=0``) of a
    matrix are not all zero: vLLM pads every adapter to ``max_lora_rank`` with zeros."""
    used = matrix.any(dim=dim).tolist()  # a few dozen flags: read in Python, not by more ops
    return next((len(used) - i for i, flag in enumerate(reversed(used)) if flag), 0)


def matrices(stacked: torch.Tensor) -> torch.Tensor:
    """``[slots, 1, out, in]`` -> ``[slots, out, in]``, a view."""
    return stacked.squeeze(1) if stacked.dim() == 4 else stacked


@dataclass(frozen=True)
class SlotLoRA:
    """One slot's adapter in one layer: ``shrink`` is ``[in, total rank]``, every slice's
    ``A`` transposed, side by side."""

    shrink: torch.Tensor
    expand: tuple[Expansion, ...]

    def add_to(self, out: torch.Tensor, rows: torch.Tensor, scale: float) -> None:
        """``out[:, slice_i] += scale * rows @ A_i.T @ B_i.T`` for every slice, in place."""
        h = rows.new_empty(rows.shape[0], self.shrink.shape[1])
        for call in self.calls(out, rows, h, scale):
            call()

    def calls(
        self, out: torch.Tensor, rows: torch.Tensor, h: torch.Tensor, scale: float
    ) -> list[Callable[[], object]]:
        """:meth:`add_to` as calls bound to its tensors, with ``h`` (``[rows, total rank]``)
        for the shrunk rows: bound once, run as often as the tensors are refilled."""
        calls: list[Callable[[], object]] = [functools.partial(torch.mm, rows, self.shrink, out=h)]
        if scale != 1.0:
            calls.append(functools.partial(h.mul_, scale))
        for columns, ranks, b in self.expand:
            calls.append(functools.partial(out[:, columns].addmm_, h[:, ranks], b))
        return calls


@dataclass(frozen=True)
class StackedLoRA:
    """Every slot's adapter in one layer, for one batched matmul per stage: ``shrink`` is
    ``[slots, in, total rank]`` and each expansion's ``B`` is ``[slots, rank, size]``, every
    slice at the largest rank any slot uses for it (zeros below)."""

    shrink: torch.Tensor
    expand: tuple[Expansion, ...]

    def refill(self, slots: Sequence[SlotLoRA | None], changed: Collection[int]) -> bool:
        """Write the ``changed`` slots of ``slots`` in place, each zeroed first, when the
        layout holds them (every slice they touch, at no more than its rank); ``False``, and
        nothing written, when it does not."""
        at = {columns.start: (ranks, b) for columns, ranks, b in self.expand}
        for slot in changed:
            weights = slots[slot]
            for columns, ranks, _ in weights.expand if weights is not None else ():
                held = at.get(columns.start)
                if held is None or ranks.stop - ranks.start > held[1].shape[1]:
                    return False
        for slot in changed:
            self.shrink[slot].zero_()
            for _, _, b in self.expand:
                b[slot].zero_()
            if (weights := slots[slot]) is None:
                continue
            for columns, ranks, b in weights.expand:
                into, stacked_b = at[columns.start]
                rank = ranks.stop - ranks.start
                self.shrink[slot, :, into.start : into.start + rank] = weights.shrink[:, ranks]
                stacked_b[slot, :rank] = b
        return True


@dataclass(frozen=True)
class LayerLoRA:
    """A layer's adapters by slot (``None`` where the slot's adapter does not touch it);
    ``width`` is the output columns the slices cover."""

    output_slices: tuple[int, ...]
    width: int
    slots: tuple[SlotLoRA | None, ...]

    @functools.cached_property
    def stacked(self) -> StackedLoRA:
        """The slots stacked, built the first time a step batches them."""
        used = [w for w in self.slots if w is not None]
        rank: dict[int, int] = {}  # output slice (by its first column) -> largest rank
        for slot_lora in used:
            for columns, ranks, _ in slot_lora.expand:
                rank[columns.start] = max(rank.get(columns.start, 0), ranks.stop - ranks.start)
        at, total = {}, 0
        for start in sorted(rank):
            at[start], total = total, total + rank[start]
        shrink = used[0].shrink.new_zeros(len(self.slots), used[0].shrink.shape[0], total)
        expand: dict[int, Expansion] = {}
        for slot, weights in enumerate(self.slots):
            if weights is None:
                continue
            for columns, ranks, b in weights.expand:
                start, r = columns.start, ranks.stop - ranks.start
                shrink[slot, :, at[start] : at[start] + r] = weights.shrink[:, ranks]
                if start not in expand:
                    stacked_b = b.new_zeros(len(self.slots), rank[start], b.shape[1])
                    expand[start] = (columns, slice(at[start], at[start] + rank[start]), stacked_b)
                expand[start][2][slot, :r] = b
        return StackedLoRA(shrink, tuple(expand[s] for s in sorted(expand)))

    @classmethod
    def of(
        cls,
        a: Sequence[torch.Tensor],
        b: Sequence[torch.Tensor],
        output_slices: Sequence[int],
        keep: LayerLoRA | None = None,
        changed: Collection[int] = (),
        prepare: Callable[[int], SlotLoRA | None] | None = None,
    ) -> LayerLoRA:
        """Prepared from the stacks: every slot, or with ``keep`` only the ``changed`` slots
        (the rest are taken from ``keep``, and its stacked weights, once built, are refilled
        in place for the changed slots where their layout holds them: ``keep`` is spent).
        ``prepare`` gives a slot's weights where they may be known already."""
        prepare = prepare or functools.partial(cls.slot_of, a, b, output_slices)
        slots = tuple(
            prepare(slot) if keep is None or slot in changed else keep.slots[slot]
            for slot in range(a[0].shape[0])
        )
        layer = cls(tuple(output_slices), sum(output_slices), slots)
        stacked = keep.__dict__.get("stacked") if keep is not None else None
        if stacked is not None and stacked.refill(slots, changed):
            layer.__dict__["stacked"] = stacked  # what the cached property would have built
        return layer

    @staticmethod
    def slot_of(
        a: Sequence[torch.Tensor],
        b: Sequence[torch.Tensor],
        output_slices: Sequence[int],
        slot: int,
    ) -> SlotLoRA | None:
        shrink, expand, offset, used = [], [], 0, 0
        for a_i, b_i, size in zip(a, b, output_slices, strict=True):
            a_slot, b_slot = matrices(a_i)[slot], matrices(b_i)[slot, :size]
            # A's rows first: a slice the adapter skips is zero there, and its B (up to
            # the vocabulary's rows for the logits) need not be read. An untrained adapter's
            # B is zero: nothing to add.
            rank = _used_rank(a_slot, dim=1)
            if rank and b_slot[:, :rank].any():
                shrink.append(a_slot[:rank])
                b_t = b_slot[:, :rank].t().contiguous()
                expand.append((slice(offset, offset + size), slice(used, used + rank), b_t))
                used += rank
            offset += size
        if not shrink:
            return None
        return SlotLoRA(torch.cat(shrink).t().contiguous(), tuple(expand))


@dataclass(frozen=True)
class _Built:
    stack: torch.Tensor  # the layer's first stack, held so its id stays the layer's key
    versions: tuple[int, ...]
    slot_ids: tuple[int | None, ...]
    layer: LayerLoRA


class HostAdapter(Protocol):
    """An adapter in vLLM's host tier (its ``LoRAModel``): the object a slot is written from,
    replaced by a new one whenever vLLM loads the adapter again."""

    id: int


# Where a layer's slot preparation is kept: the layer's first stack and its output slices.
Site = tuple[int, tuple[int, ...]]


class PreparedLoRA:
    """:class:`LayerLoRA` per layer, kept until vLLM writes into its stacks.

    vLLM loads an adapter into a slot in place, which moves the stacks' version counters but
    does not say which slot changed; :meth:`assign` does, from vLLM's slot-to-adapter list,
    so only slots whose adapter changed are prepared again. A write that changes no slot's
    adapter (none that vLLM makes) rebuilds the whole layer from the stacks.

    :meth:`activated` says which host-tier adapter vLLM wrote into a slot; a changed slot's
    preparation is kept with that adapter for as long as vLLM keeps it in its host cache (a
    weak key), and taken from there when the adapter comes back into a slot. The host tier
    then holds, beside each adapter, its prepared copy: the adapter's used ranks, transposed.
    """

    def __init__(self) -> None:
        self._slot_ids: tuple[int | None, ...] = ()
        self._built: dict[int, _Built] = {}
        self._activated: dict[int, weakref.ref[HostAdapter]] = {}
        self._by_adapter: weakref.WeakKeyDictionary[HostAdapter, dict[Site, SlotLoRA | None]]
        self._by_adapter = weakref.WeakKeyDictionary()

    def assign(self, slot_ids: Sequence[int | None]) -> None:
        """The adapter each slot holds now (vLLM's ``lora_index_to_id``)."""
        self._slot_ids = tuple(slot_ids)

    def activated(self, slot: int, adapter: HostAdapter) -> None:
        """vLLM wrote ``adapter``, from its host tier, into ``slot``."""
        self._activated[slot] = weakref.ref(adapter)

    def of(
        self,
        a: Sequence[torch.Tensor],
        b: Sequence[torch.Tensor],
        output_slices: Sequence[int],
    ) -> LayerLoRA:
        output_slices = tuple(output_slices)
        versions = tuple(t._version for t in a) + tuple(t._version for t in b)
        built = self._built.get(id(a[0]))
        keep, changed = None, []
        announced: Collection[int] = range(len(self._slot_ids))  # a first build: every slot
        if built and built.stack is a[0] and built.layer.output_slices == output_slices:
            if built.versions == versions:
                return built.layer
            announced = []  # unless a slot's adapter changed, the stacks alone are trusted
            if len(built.slot_ids) == len(self._slot_ids):
                pairs = zip(built.slot_ids, self._slot_ids, strict=True)
                changed = [slot for slot, (then, now) in enumerate(pairs) if then != now]
                keep, announced = (built.layer, changed) if changed else (None, [])
        site = (id(a[0]), output_slices)
        prepare = functools.partial(self._prepare, a, b, site, frozenset(announced))
        layer = LayerLoRA.of(a, b, output_slices, keep, changed, prepare)
        self._built[id(a[0])] = _Built(a[0], versions, self._slot_ids, layer)
        return layer

    def _prepare(
        self,
        a: Sequence[torch.Tensor],
        b: Sequence[torch.Tensor],
        site: Site,
        announced: Collection[int],
        slot: int,
    ) -> SlotLoRA | None:
        """The slot's weights: kept with its host-tier adapter when the slot's adapter changed
        to the one vLLM said it activated there, prepared from the stacks otherwise."""
        held = self._activated.get(slot) if slot in announced else None
        adapter = held() if held is not None else None
        if adapter is None or adapter.id != self._slot_ids[slot]:
            return LayerLoRA.slot_of(a, b, site[1], slot)
        prepared = self._by_adapter.setdefault(adapter, {})
        if site not in prepared:
            prepared[site] = LayerLoRA.slot_of(a, b, site[1], slot)
        return prepared[site]
