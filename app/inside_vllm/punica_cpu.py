"""Tenant-isolating CPU implementations of vLLM's punica LoRA ops.

vLLM 0.32's PyTorch-native ops gather ``weights[lora_indices]`` per token, and a token
without an adapter carries slot ``-1``, which torch wraps to the *last* slot: a base-model
request batched beside adapter requests is computed with another tenant's adapter
(docs/isolation.md). These replacements keep each upstream signature and its semantics for
rows with a slot ``>= 0`` (``*_shrink`` writes ``scaling * inputs @ A[slot].T``, ``*_expand``
and ``*_expand_slice`` add ``inputs @ B[slot].T`` into the output or its slice), leave rows
with slot ``-1`` zero (shrink) or untouched (expand), and multiply each slot's rows as one
group instead of gathering weights per token.
"""

from __future__ import annotations

from typing import TypeAlias

import torch
import torch.nn.functional as F

# A group of rows sharing one adapter slot: a contiguous slice where possible
# (basic indexing gives views, no copies), else an index tensor.
Rows: TypeAlias = slice | torch.Tensor
Groups: TypeAlias = list[tuple[int, Rows]]

__all__ = [
    "bgmv_expand",
    "bgmv_expand_slice",
    "bgmv_shrink",
    "sgmv_expand",
    "sgmv_expand_slice",
    "sgmv_shrink",
]


def _stacked(weights: torch.Tensor) -> torch.Tensor:
    """``[slots, 1, out, in]`` or ``[slots, out, in]`` -> ``[slots, out, in]``."""
    if weights.dim() == 4:
        assert weights.shape[1] == 1, f"unexpected stacked LoRA shape {tuple(weights.shape)}"
        return weights.squeeze(1)
    assert weights.dim() == 3, f"unexpected stacked LoRA shape {tuple(weights.shape)}"
    return weights


def _groups_by_slot(lora_indices: torch.Tensor) -> Groups:
    """Rows per adapter slot for a per-token index vector; slot ``-1`` omitted."""
    groups: Groups = []
    for slot in torch.unique(lora_indices).tolist():
        if slot < 0:
            continue
        rows = torch.nonzero(lora_indices == slot).squeeze(1)
        first, last = int(rows[0]), int(rows[-1])
        if last - first + 1 == rows.numel():
            groups.append((slot, slice(first, last + 1)))
        else:
            groups.append((slot, rows))
    return groups


def _groups_by_segment(seq_len_tensor: torch.Tensor, lora_indices_tensor: torch.Tensor) -> Groups:
    """Contiguous row ranges of the prefill segments; slot ``-1`` omitted.

    Segment starts are the running sum of ``seq_len_tensor``, which is how the
    upstream op lays tokens out (it ignores ``b_seq_start_loc`` too).
    """
    groups: Groups = []
    start = 0
    for length, slot in zip(seq_len_tensor.tolist(), lora_indices_tensor.tolist(), strict=True):
        if slot >= 0 and length > 0:
            groups.append((slot, slice(start, start + length)))
        start += length
    return groups


def _align_rows(
    inputs: torch.Tensor, lora_indices: torch.Tensor, num_out_rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Match the token rows to the output rows the way the upstream ops do.

    Upstream broadcasts a single token row over all output rows, and drops
    token rows beyond the output's (padding); fewer token rows than output
    rows is an error there and here.
    """
    num_tokens = lora_indices.shape[0]
    assert inputs.shape[0] == num_tokens, (
        f"{inputs.shape[0]} input rows but {num_tokens} LoRA indices"
    )
    if num_tokens == 1 and num_out_rows != 1:
        return inputs.expand(num_out_rows, -1), lora_indices.expand(num_out_rows)
    if num_tokens > num_out_rows:
        return inputs[:num_out_rows], lora_indices[:num_out_rows]
    assert num_tokens == num_out_rows, f"{num_tokens} token rows for {num_out_rows} output rows"
    return inputs, lora_indices


def _shrink(
    inputs: torch.Tensor,
    weights: torch.Tensor,
    output_tensor: torch.Tensor,
    groups: Groups,
    scaling: float,
) -> None:
    w = _stacked(weights)
    dtype = output_tensor.dtype
    out = output_tensor[:, : w.shape[1]]
    out.zero_()
    for slot, rows in groups:
        out[rows] = scaling * F.linear(inputs[rows].to(dtype), w[slot].to(dtype))


def _expand(
    inputs: torch.Tensor,
    weights: torch.Tensor,
    output_tensor: torch.Tensor,
    groups: Groups,
    col_start: int,
    col_end: int,
    add_inputs: bool,
) -> None:
    w = _stacked(weights)
    dtype = output_tensor.dtype
    out = output_tensor[:, col_start:col_end]
    width = out.shape[1]
    for slot, rows in groups:
        delta = F.linear(inputs[rows].to(dtype), w[slot, :width].to(dtype))
        if add_inputs:
            out[rows] += delta
        else:
            out[rows] = delta


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
) -> None:
    """Per-token shrink: ``output[t, :rank] = scaling * inputs[t] @ A[idx[t]].T``.

    ``lora_b_weights`` holds the A matrices (upstream's parameter name);
    rows with index ``-1`` get zeros.
    """
    inputs, indices = _align_rows(inputs, lora_indices_tensor, output_tensor.shape[0])
    _shrink(inputs, lora_b_weights, output_tensor, _groups_by_slot(indices), scaling)


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
) -> None:
    """Per-token expand into ``output[:, :n]``, ``n = min(out_dim, output.shape[1])``.

    Rows with index ``-1`` are left unchanged.
    """
    inputs, indices = _align_rows(inputs, lora_indices_tensor, output_tensor.shape[0])
    common_len = min(_stacked(lora_b_weights).shape[1], output_tensor.shape[1])
    _expand(
        inputs, lora_b_weights, output_tensor, _groups_by_slot(indices), 0, common_len, add_inputs
    )


def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    """Per-token expand into ``output[:, slice_offset:slice_offset + slice_size]``.

    ``out_dim`` of the weights must equal ``slice_size``. Rows with index
    ``-1`` are left unchanged.
    """
    out_dim = _stacked(lora_b_weights).shape[1]
    assert out_dim == slice_size, f"slice_size {slice_size} != LoRA out dim {out_dim}"
    inputs, indices = _align_rows(inputs, lora_indices_tensor, output_tensor.shape[0])
    _expand(
        inputs,
        lora_b_weights,
        output_tensor,
        _groups_by_slot(indices),
        slice_offset,
        slice_offset + slice_size,
        add_inputs,
    )


def _prefill_groups(
    inputs: torch.Tensor,
    output_tensor: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
) -> tuple[torch.Tensor, Groups]:
    """Groups for the ``sgmv_*`` ops: the segments themselves when the token
    rows line up with the output rows, else the per-token path's alignment."""
    num_tokens = int(seq_len_tensor.sum())
    if num_tokens == inputs.shape[0] == output_tensor.shape[0]:
        return inputs, _groups_by_segment(seq_len_tensor, lora_indices_tensor)
    exploded = torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)
    inputs, indices = _align_rows(inputs, exploded, output_tensor.shape[0])
    return inputs, _groups_by_slot(indices)


def sgmv_shrink(
    inputs: torch.Tensor,
    lora_a_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    scaling: float,
) -> None:
    """Segmented shrink: segment ``i`` (``seq_len_tensor[i]`` consecutive
    tokens) uses slot ``lora_indices_tensor[i]``; ``-1`` segments get zeros."""
    inputs, groups = _prefill_groups(inputs, output_tensor, seq_len_tensor, lora_indices_tensor)
    _shrink(inputs, lora_a_weights, output_tensor, groups, scaling)


def sgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    add_inputs: bool = False,
) -> None:
    """Segmented :func:`bgmv_expand`; ``-1`` segments are left unchanged."""
    inputs, groups = _prefill_groups(inputs, output_tensor, seq_len_tensor, lora_indices_tensor)
    common_len = min(_stacked(lora_b_weights).shape[1], output_tensor.shape[1])
    _expand(inputs, lora_b_weights, output_tensor, groups, 0, common_len, add_inputs)


def sgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = False,
) -> None:
    """Segmented :func:`bgmv_expand_slice`; ``-1`` segments are left unchanged."""
    out_dim = _stacked(lora_b_weights).shape[1]
    assert out_dim == slice_size, f"slice_size {slice_size} != LoRA out dim {out_dim}"
    inputs, groups = _prefill_groups(inputs, output_tensor, seq_len_tensor, lora_indices_tensor)
    _expand(
        inputs,
        lora_b_weights,
        output_tensor,
        groups,
        slice_offset,
        slice_offset + slice_size,
        add_inputs,
    )
