"""The benchmark's adapters: deterministic, ranks alternating, reused when present."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from bench.random_adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS, ensure_bench_adapters


def tiny_model(directory: Path) -> Path:
    """A checkpoint with the shapes of one attention block (no real model needed)."""
    directory.mkdir()
    tensors = {
        f"model.layers.0.self_attn.{name}.weight": torch.zeros(out, 16)
        for name, out in (("q_proj", 16), ("k_proj", 8), ("v_proj", 8), ("o_proj", 16))
    }
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def test_adapters_are_deterministic_and_reused(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "model")
    adapters = ensure_bench_adapters(model, tmp_path / "a", 3)
    assert [(a.name, a.rank) for a in adapters] == [
        ("bench-000", 8),
        ("bench-001", 16),
        ("bench-002", 8),
    ]
    config = json.loads((adapters[1].path / ADAPTER_CONFIG).read_text())
    assert config["r"] == 16
    assert config["target_modules"] == ["k_proj", "o_proj", "q_proj", "v_proj"]
    weights = adapters[0].path / ADAPTER_WEIGHTS
    first = load_file(str(weights))
    written_at = weights.stat().st_mtime_ns

    # A rerun keeps what is there; another directory gets identical tensors.
    again = ensure_bench_adapters(model, tmp_path / "a", 3)
    assert again == adapters
    assert weights.stat().st_mtime_ns == written_at
    elsewhere = ensure_bench_adapters(model, tmp_path / "b", 1)
    second = load_file(str(elsewhere[0].path / ADAPTER_WEIGHTS))
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    # Different adapters differ.
    other = load_file(str(adapters[2].path / ADAPTER_WEIGHTS))
    key = next(iter(first))
    assert not torch.equal(first[key], other[key])
