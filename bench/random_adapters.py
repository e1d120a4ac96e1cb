"""Deterministic random PEFT LoRA adapters for a local base model.

The adapter is written straight from the base checkpoint's tensor shapes (no
model load), so building one takes well under a second. The benchmark makes
its many tenants' adapters this way; the tests use it for adapters whose
weights they control.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def _linear_shapes(model_dir: Path, target_modules: Sequence[str]) -> dict[str, tuple[int, int]]:
    """``{module path: (out_features, in_features)}`` of the targeted linear layers."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    targets = tuple(target_modules)
    shapes: dict[str, tuple[int, int]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if not key.endswith(".weight"):
                    continue
                module = key.removesuffix(".weight")
                shape = f.get_slice(key).get_shape()
                if module.rsplit(".", 1)[-1] in targets and len(shape) == 2:
                    shapes[module] = (int(shape[0]), int(shape[1]))
    found = {m.rsplit(".", 1)[-1] for m in shapes}
    missing = set(targets) - found
    if missing:
        raise ValueError(f"target modules not found as linear layers in {model_dir}: {missing}")
    return shapes


def make_random_adapter(
    model_dir: Path,
    out_dir: Path,
    *,
    rank: int,
    target_modules: Sequence[str],
    seed: int,
    b_scale: float = 1.0,
    lora_alpha: int | None = None,
) -> Path:
    """Write a PEFT LoRA adapter with seeded random A and B to ``out_dir``.

    Both matrices are drawn like ``nn.Linear``'s default init (uniform in
    ``±1/sqrt(fan_in)``), i.e. PEFT with ``init_lora_weights=False``, then B
    is multiplied by ``b_scale`` so the adapter's greedy output differs
    clearly from the base model's without turning it into noise. The same
    arguments always give the same tensors. ``lora_alpha`` defaults to
    ``rank`` (scaling 1). Only ``adapter_config.json`` and
    ``adapter_model.safetensors`` are written. Returns ``out_dir``.
    """
    shapes = _linear_shapes(model_dir, target_modules)
    gen = torch.Generator().manual_seed(seed)

    def uniform(rows: int, cols: int, bound: float) -> torch.Tensor:
        return (torch.rand(rows, cols, generator=gen, dtype=torch.float32) * 2 - 1) * bound

    tensors: dict[str, torch.Tensor] = {}
    for module in sorted(shapes):
        out_features, in_features = shapes[module]
        prefix = f"base_model.model.{module}"
        tensors[f"{prefix}.lora_A.weight"] = uniform(rank, in_features, in_features**-0.5)
        tensors[f"{prefix}.lora_B.weight"] = uniform(out_features, rank, rank**-0.5) * b_scale

    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model_dir),
        "r": rank,
        "lora_alpha": rank if lora_alpha is None else lora_alpha,
        "lora_dropout": 0.0,
        "target_modules": sorted(set(target_modules)),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "init_lora_weights": False,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(out_dir / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    return out_dir


# The benchmark's tenants fine-tune the attention projections (a common LoRA
# set-up): realistic swaps, at a quarter of the disk and compute an
# all-projections adapter would need, so 128 of them stay cheap to keep.
BENCH_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
# Every linear projection of a Llama-style block: what a full fine-tune's adapter targets.
ALL_PROJECTIONS = (*BENCH_TARGET_MODULES, "gate_proj", "up_proj", "down_proj")
BENCH_RANKS = (8, 16)
# Small enough that the adapted model stays fluent-ish (so outputs run to
# max_tokens rather than collapsing into an early end-of-sequence token).
BENCH_B_SCALE = 0.5


@dataclass(frozen=True)
class BenchAdapter:
    name: str
    rank: int
    path: Path


def bench_adapter_name(index: int, prefix: str = "bench") -> str:
    return f"{prefix}-{index:03d}"


def ensure_bench_adapters(
    model_dir: Path,
    root: Path,
    count: int,
    ranks: Sequence[int] = BENCH_RANKS,
    target_modules: Sequence[str] = BENCH_TARGET_MODULES,
    prefix: str = "bench",
) -> list[BenchAdapter]:
    """``count`` deterministic adapters under ``root`` (ranks taking turns from ``ranks``), on
    ``target_modules``, named ``prefix-000`` onwards.

    Adapter ``i`` always has the same weights (its seed is ``i``): one already
    on disk from the same recipe is reused, so reruns skip the writing and
    both systems always serve identical bytes.
    """
    adapters: list[BenchAdapter] = []
    for index in range(count):
        name = bench_adapter_name(index, prefix)
        rank = ranks[index % len(ranks)]
        out = root / name
        recipe = {
            "rank": rank,
            "seed": index,
            "b_scale": BENCH_B_SCALE,
            "target_modules": list(target_modules),
        }
        # The recipe sits beside the adapter, not in it: the adapter directory
        # holds exactly what a tenant would upload.
        recipe_file = root / f"{name}.recipe.json"
        written = (out / ADAPTER_WEIGHTS).is_file() and recipe_file.is_file()
        if not written or json.loads(recipe_file.read_text()) != recipe:
            make_random_adapter(
                model_dir,
                out,
                rank=rank,
                target_modules=target_modules,
                seed=index,
                b_scale=BENCH_B_SCALE,
            )
            recipe_file.write_text(json.dumps(recipe) + "\n")
        adapters.append(BenchAdapter(name, rank, out))
    return adapters
