"""Unit tests of the tenant-isolating CPU punica ops and the plugin applying them.

Each op is checked against a per-row computation written from the contract:
shrink rows with slot -1 are zero, expand rows with slot -1 are untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch

from app.inside_vllm import punica_cpu as fixed
from app.inside_vllm.punica_wrapper import PlannedPunicaWrapper

SLOTS = 3
IN_DIM, OUT_DIM, MAX_RANK = 24, 20, 8
RANKS = (8, 4, 2)  # per slot; slots hold adapters below the max rank too


def _stacked_a(gen: torch.Generator) -> torch.Tensor:
    """[slots, 1, max_rank, in] with rows beyond each slot's rank zero, as vLLM stacks them."""
    a = torch.zeros(SLOTS, 1, MAX_RANK, IN_DIM)
    for slot, rank in enumerate(RANKS):
        a[slot, 0, :rank] = torch.randn(rank, IN_DIM, generator=gen)
    return a


def _stacked_b(gen: torch.Generator, out_dim: int = OUT_DIM) -> torch.Tensor:
    """[slots, 1, out, max_rank] with columns beyond each slot's rank zero."""
    b = torch.zeros(SLOTS, 1, out_dim, MAX_RANK)
    for slot, rank in enumerate(RANKS):
        b[slot, 0, :, :rank] = torch.randn(out_dim, rank, generator=gen)
    return b


def _ref_shrink(
    x: torch.Tensor, a: torch.Tensor, out: torch.Tensor, idx: list[int], scale: float
) -> torch.Tensor:
    want = out.clone()
    for t, slot in enumerate(idx):
        rank = MAX_RANK
        want[t, :rank] = 0 if slot < 0 else scale * (a[slot, 0] @ x[t])
    return want


def _ref_expand(
    x: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    idx: list[int],
    offset: int,
    width: int,
    add: bool,
) -> torch.Tensor:
    want = out.clone()
    for t, slot in enumerate(idx):
        if slot < 0:
            continue
        delta = (b[slot, 0] @ x[t])[:width]
        want[t, offset : offset + width] = (
            want[t, offset : offset + width] + delta if add else delta
        )
    return want


def _segments(segs: list[tuple[int, int]]) -> tuple[torch.Tensor, ...]:
    """sgmv metadata for [(slot, length), ...], as compute_meta builds it."""
    lens = torch.tensor([n for _, n in segs])
    starts = torch.cumsum(lens, 0) - lens
    return starts, lens, torch.tensor([s for s, _ in segs])


def _explode(segs: list[tuple[int, int]]) -> list[int]:
    return [slot for slot, n in segs for _ in range(n)]


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


# Slot -1 first, in the middle and last; slots repeated and non-contiguous.
TOKEN_INDICES = [-1, 0, 2, -1, 1, 0, 0, 2, -1, 1, -1]
SEGMENTS = [(-1, 3), (0, 2), (2, 4), (-1, 1), (0, 3), (1, 1), (-1, 2)]


def test_bgmv_shrink(gen: torch.Generator) -> None:
    a = _stacked_a(gen)
    x = torch.randn(len(TOKEN_INDICES), IN_DIM, generator=gen)
    out = torch.randn(len(TOKEN_INDICES), MAX_RANK + 3, generator=gen)  # extra cols untouched
    want = _ref_shrink(x, a, out, TOKEN_INDICES, 0.5)
    fixed.bgmv_shrink(x, a, out, torch.tensor(TOKEN_INDICES), 0.5)
    torch.testing.assert_close(out, want)


@pytest.mark.parametrize("add_inputs", [True, False])
def test_bgmv_expand(gen: torch.Generator, add_inputs: bool) -> None:
    b = _stacked_b(gen)
    x = torch.randn(len(TOKEN_INDICES), MAX_RANK, generator=gen)
    out = torch.randn(len(TOKEN_INDICES), OUT_DIM, generator=gen)
    want = _ref_expand(x, b, out, TOKEN_INDICES, 0, OUT_DIM, add_inputs)
    fixed.bgmv_expand(x, b, out, torch.tensor(TOKEN_INDICES), add_inputs)
    torch.testing.assert_close(out, want)


@pytest.mark.parametrize("out_cols", [OUT_DIM + 5, OUT_DIM - 4])
def test_bgmv_expand_common_len(gen: torch.Generator, out_cols: int) -> None:
    """Output wider (padded logits) or narrower than the adapter: min of both."""
    b = _stacked_b(gen)
    x = torch.randn(len(TOKEN_INDICES), MAX_RANK, generator=gen)
    out = torch.randn(len(TOKEN_INDICES), out_cols, generator=gen)
    want = _ref_expand(x, b, out, TOKEN_INDICES, 0, min(OUT_DIM, out_cols), True)
    fixed.bgmv_expand(x, b, out, torch.tensor(TOKEN_INDICES), True)
    torch.testing.assert_close(out, want)


@pytest.mark.parametrize("add_inputs", [True, False])
def test_bgmv_expand_slice(gen: torch.Generator, add_inputs: bool) -> None:
    """Two slices side by side (as for fused qkv), each its own stacked weights."""
    b1, b2 = _stacked_b(gen, 6), _stacked_b(gen, 10)
    x1 = torch.randn(len(TOKEN_INDICES), MAX_RANK, generator=gen)
    x2 = torch.randn(len(TOKEN_INDICES), MAX_RANK, generator=gen)
    out = torch.randn(len(TOKEN_INDICES), 2 + 6 + 10 + 3, generator=gen)
    want = _ref_expand(x1, b1, out, TOKEN_INDICES, 2, 6, add_inputs)
    want = _ref_expand(x2, b2, want, TOKEN_INDICES, 8, 10, add_inputs)
    idx = torch.tensor(TOKEN_INDICES)
    fixed.bgmv_expand_slice(x1, b1, out, idx, 2, 6, add_inputs)
    fixed.bgmv_expand_slice(x2, b2, out, idx, 8, 10, add_inputs)
    torch.testing.assert_close(out, want)


def test_sgmv_shrink_mixed_segments(gen: torch.Generator) -> None:
    a = _stacked_a(gen)
    idx = _explode(SEGMENTS)
    x = torch.randn(len(idx), IN_DIM, generator=gen)
    out = torch.randn(len(idx), MAX_RANK, generator=gen)
    want = _ref_shrink(x, a, out, idx, 2.0)
    starts, lens, slots = _segments(SEGMENTS)
    fixed.sgmv_shrink(x, a, out, starts, lens, slots, len(SEGMENTS), 4, len(idx), 2.0)
    torch.testing.assert_close(out, want)


@pytest.mark.parametrize("add_inputs", [True, False])
def test_sgmv_expand_mixed_segments(gen: torch.Generator, add_inputs: bool) -> None:
    b = _stacked_b(gen)
    idx = _explode(SEGMENTS)
    x = torch.randn(len(idx), MAX_RANK, generator=gen)
    out = torch.randn(len(idx), OUT_DIM, generator=gen)
    want = _ref_expand(x, b, out, idx, 0, OUT_DIM, add_inputs)
    starts, lens, slots = _segments(SEGMENTS)
    fixed.sgmv_expand(x, b, out, starts, lens, slots, len(SEGMENTS), 4, len(idx), add_inputs)
    torch.testing.assert_close(out, want)


@pytest.mark.parametrize("add_inputs", [True, False])
def test_sgmv_expand_slice_mixed_segments(gen: torch.Generator, add_inputs: bool) -> None:
    b = _stacked_b(gen, 7)
    idx = _explode(SEGMENTS)
    x = torch.randn(len(idx), MAX_RANK, generator=gen)
    out = torch.randn(len(idx), 3 + 7 + 2, generator=gen)
    want = _ref_expand(x, b, out, idx, 3, 7, add_inputs)
    starts, lens, slots = _segments(SEGMENTS)
    fixed.sgmv_expand_slice(
        x, b, out, starts, lens, slots, len(SEGMENTS), 4, len(idx), 3, 7, add_inputs
    )
    torch.testing.assert_close(out, want)


def test_lora_then_no_lora_roundtrip_leaves_base_rows_exact(gen: torch.Generator) -> None:
    """The layer pattern shrink -> expand(add) leaves base rows bit-identical."""
    a, b = _stacked_a(gen), _stacked_b(gen)
    idx = torch.tensor(TOKEN_INDICES)
    x = torch.randn(len(TOKEN_INDICES), IN_DIM, generator=gen)
    y = torch.randn(len(TOKEN_INDICES), OUT_DIM, generator=gen)
    base_rows = idx < 0
    y_before = y.clone()
    buf = torch.zeros(len(TOKEN_INDICES), MAX_RANK)
    fixed.bgmv_shrink(x, a, buf, idx, 1.0)
    fixed.bgmv_expand(buf, b, y, idx, True)
    assert torch.equal(y[base_rows], y_before[base_rows])
    assert not torch.equal(y[~base_rows], y_before[~base_rows])


def test_single_token_row_broadcasts_like_upstream(gen: torch.Generator) -> None:
    from vllm.lora.ops.torch_ops import lora_ops as upstream

    b = _stacked_b(gen)
    x = torch.randn(1, MAX_RANK, generator=gen)
    out = torch.randn(4, OUT_DIM, generator=gen)
    want = out.clone()
    upstream.bgmv_expand(x, b, want, torch.tensor([1]), True)
    fixed.bgmv_expand(x, b, out, torch.tensor([1]), True)
    torch.testing.assert_close(out, want)
    untouched = out.clone()
    fixed.bgmv_expand(x, b, out, torch.tensor([-1]), True)
    assert torch.equal(out, untouched)


def test_matches_upstream_when_every_row_has_an_adapter(gen: torch.Generator) -> None:
    from vllm.lora.ops.torch_ops import lora_ops as upstream

    a, b = _stacked_a(gen), _stacked_b(gen)
    idx = torch.tensor([2, 0, 1, 1, 0, 2, 2])
    x = torch.randn(len(idx), IN_DIM, generator=gen)
    got, want = torch.zeros(len(idx), MAX_RANK), torch.zeros(len(idx), MAX_RANK)
    fixed.bgmv_shrink(x, a, got, idx, 0.25)
    upstream.bgmv_shrink(x, a, want, idx, 0.25)
    torch.testing.assert_close(got, want)
    y_got, y_want = torch.ones(len(idx), OUT_DIM), torch.ones(len(idx), OUT_DIM)
    fixed.bgmv_expand(got, b, y_got, idx, True)
    upstream.bgmv_expand(want, b, y_want, idx, True)
    torch.testing.assert_close(y_got, y_want)


def test_upstream_ops_apply_last_slot_to_no_adapter_rows(gen: torch.Generator) -> None:
    """The bug this module exists for: upstream vLLM 0.32 wraps slot -1 to the
    last slot. If this fails, upstream changed; re-check whether the plugin is
    still needed."""
    from vllm.lora.ops.torch_ops import lora_ops as upstream

    a, b = _stacked_a(gen), _stacked_b(gen)
    last = SLOTS - 1
    x = torch.randn(2, IN_DIM, generator=gen)
    buf = torch.zeros(2, MAX_RANK)
    upstream.bgmv_shrink(x, a, buf, torch.tensor([-1, 0]), 1.0)
    torch.testing.assert_close(buf[0], a[last, 0] @ x[0])  # should be zero
    assert buf[0].abs().sum() > 0

    y = torch.zeros(2, OUT_DIM)
    starts, lens, slots = _segments([(-1, 1), (0, 1)])
    upstream.sgmv_expand(buf, b, y, starts, lens, slots, 2, 1, 2, True)
    torch.testing.assert_close(y[0], b[last, 0] @ buf[0])  # should be untouched zeros
    assert y[0].abs().sum() > 0


# --------------------------------------------------------------------------- plugin


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """The plugin module with fresh per-process state and the wrapper on the
    upstream ops (an engine may have applied the fix in this process already);
    all undone after."""
    import vllm.lora.punica_wrapper.punica_cpu as wrapper
    from vllm.lora.model_manager import LoRAModelManager
    from vllm.lora.ops.torch_ops import lora_ops as upstream

    from app.inside_vllm import plugin as vllm_plugin

    monkeypatch.setattr(vllm_plugin, "_outcome", None)
    for name in vllm_plugin.PATCHED_OPS:
        monkeypatch.setattr(wrapper, name, getattr(upstream, name))
    monkeypatch.setattr(wrapper, "PunicaWrapperCPU", PlannedPunicaWrapper.__mro__[1])
    activate = LoRAModelManager.activate_adapter
    unwrapped = getattr(activate, "__wrapped__", activate)
    monkeypatch.setattr(LoRAModelManager, "activate_adapter", unwrapped)
    monkeypatch.delenv(vllm_plugin.ENV_VAR, raising=False)
    yield vllm_plugin


def reports_activations() -> bool:
    """vLLM's model manager tells the planned wrapper what it activates, wrapped once."""
    from vllm.lora.model_manager import LoRAModelManager

    activate = LoRAModelManager.activate_adapter
    wrapped = getattr(activate, "__wrapped__", None)
    return wrapped is not None and not hasattr(wrapped, "__wrapped__")


def _gateway_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "lora_gateway.vllm_plugin"]


def test_plugin_patches_wrapper_namespace_once(
    plugin: object, caplog: pytest.LogCaptureFixture
) -> None:
    import vllm.lora.punica_wrapper.punica_cpu as wrapper
    from vllm.lora.ops.torch_ops import lora_ops as upstream

    from app.inside_vllm import plugin as vllm_plugin

    caplog.set_level(logging.INFO, logger="lora_gateway.vllm_plugin")
    vllm_plugin.register()
    vllm_plugin.register()
    for name in vllm_plugin.PATCHED_OPS:
        assert getattr(wrapper, name) is getattr(fixed, name)
        assert getattr(upstream, name) is not getattr(fixed, name)  # only the wrapper's view
    assert wrapper.PunicaWrapperCPU is PlannedPunicaWrapper
    assert reports_activations()
    records = _gateway_records(caplog)
    assert len(records) == 1
    assert records[0].levelno == logging.INFO
    assert "isolation fix active" in records[0].getMessage()


@pytest.mark.parametrize("value", ["0", "false", "FALSE"])
def test_plugin_disabled_by_env(
    plugin: object,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    value: str,
) -> None:
    import vllm.lora.punica_wrapper.punica_cpu as wrapper

    from app.inside_vllm import plugin as vllm_plugin

    caplog.set_level(logging.INFO, logger="lora_gateway.vllm_plugin")
    monkeypatch.setenv(vllm_plugin.ENV_VAR, value)
    vllm_plugin.register()
    vllm_plugin.register()
    assert all(getattr(wrapper, n) is not getattr(fixed, n) for n in vllm_plugin.PATCHED_OPS)
    assert wrapper.PunicaWrapperCPU is not PlannedPunicaWrapper
    assert not reports_activations()
    records = _gateway_records(caplog)
    assert len(records) == 1
    assert "DISABLED" in records[0].getMessage()


def test_plugin_skips_other_vllm_versions(plugin: object, monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm
    import vllm.lora.punica_wrapper.punica_cpu as wrapper

    from app.inside_vllm import plugin as vllm_plugin

    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    vllm_plugin.register()
    assert all(getattr(wrapper, n) is not getattr(fixed, n) for n in vllm_plugin.PATCHED_OPS)
    assert wrapper.PunicaWrapperCPU is not PlannedPunicaWrapper


def test_plugin_skips_non_cpu_platforms(plugin: object, monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.lora.punica_wrapper.punica_cpu as wrapper
    from vllm.platforms import current_platform

    from app.inside_vllm import plugin as vllm_plugin

    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: False)
    vllm_plugin.register()
    assert all(getattr(wrapper, n) is not getattr(fixed, n) for n in vllm_plugin.PATCHED_OPS)
    assert wrapper.PunicaWrapperCPU is not PlannedPunicaWrapper
