"""Adapter directories for tests: a tiny fake base model and PEFT LoRA directories written with
``safetensors.torch.save_file`` (the upload validation tests), and adapters put in a bucket
without the upload's checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from app.tenancy.adapters import content_sha256
from app.tenancy.base_model import BaseModelInfo
from app.tenancy.storage.manifest import Manifest
from app.tenancy.storage.s3 import S3Content
from app.tenancy.validation import validate_adapter_dir

LAYERS = 2
SHAPES = {  # suffix -> (parent module, (out_features, in_features)), hidden 16, kv 8
    "q_proj": ("self_attn", (16, 16)),
    "k_proj": ("self_attn", (8, 16)),
    "v_proj": ("self_attn", (8, 16)),
    "o_proj": ("self_attn", (16, 16)),
    "gate_proj": ("mlp", (32, 16)),
    "up_proj": ("mlp", (32, 16)),
    "down_proj": ("mlp", (16, 32)),
}
BASE_NAME = "TinyLlama-Test"
MAX_RANK = 16
MAX_BYTES = 1 << 20


def module_path(layer: int, suffix: str) -> str:
    return f"model.layers.{layer}.{SHAPES[suffix][0]}.{suffix}"


def fake_base_model(root: Path) -> BaseModelInfo:
    """A tiny Llama-shaped base model (config.json and zero weights) under ``root``."""
    model_dir = root / BASE_NAME
    model_dir.mkdir()
    config = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": LAYERS}
    (model_dir / "config.json").write_text(json.dumps(config))
    tensors = {
        "model.embed_tokens.weight": torch.zeros(64, 16),
        "model.norm.weight": torch.ones(16),
    }
    for layer in range(LAYERS):
        tensors[f"model.layers.{layer}.input_layernorm.weight"] = torch.ones(16)
        for suffix, (_, shape) in SHAPES.items():
            tensors[f"{module_path(layer, suffix)}.weight"] = torch.zeros(shape)
    save_file(tensors, str(model_dir / "model.safetensors"))
    return BaseModelInfo.from_model_dir(model_dir)


def lora_tensors(
    targets: tuple[str, ...] = ("q_proj", "v_proj"),
    rank: int = 4,
    dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    tensors = {}
    for layer in range(LAYERS):
        for suffix in targets:
            out_features, in_features = SHAPES[suffix][1]
            prefix = f"base_model.model.{module_path(layer, suffix)}"
            tensors[f"{prefix}.lora_A.weight"] = torch.ones(rank, in_features, dtype=dtype)
            tensors[f"{prefix}.lora_B.weight"] = torch.zeros(out_features, rank, dtype=dtype)
    return tensors


def make_adapter(
    root: Path,
    name: str = "adapter",
    tensors: dict[str, torch.Tensor] | None = None,
    **config: Any,
) -> Path:
    """A PEFT LoRA dir: rank 4 on q_proj/v_proj unless ``config`` (None deletes a key) says."""
    directory = root / name
    directory.mkdir(parents=True)
    settings: dict[str, Any] = {
        "peft_type": "LORA",
        "r": 4,
        "lora_alpha": 8,
        "target_modules": ["q_proj", "v_proj"],
        "base_model_name_or_path": f"acme/{BASE_NAME}",
        "bias": "none",
        "use_dora": False,
        "modules_to_save": None,
    }
    settings.update(config)
    settings = {key: value for key, value in settings.items() if value is not None}
    (directory / "adapter_config.json").write_text(json.dumps(settings))
    weights = lora_tensors() if tensors is None else tensors
    save_file(weights, str(directory / "adapter_model.safetensors"))
    return directory


def validate(directory: Path, base: BaseModelInfo, max_bytes: int = MAX_BYTES) -> Any:
    return validate_adapter_dir(directory, base, max_rank=MAX_RANK, max_bytes=max_bytes)


def publish_unchecked(content: S3Content, name: str, version: int, directory: Path) -> str:
    """Put ``directory`` in the bucket as version ``version`` of ``name``, as an upload does
    but without its checks (an adapter stored before a check existed); its digest."""
    digest = content_sha256(directory)
    content.upload(directory, Manifest.of_directory(directory, digest))
    content.publish_version(name, version, digest)
    return digest


def with_config(directory: Path, **changes: Any) -> Path:
    """``directory`` with its adapter_config.json changed by ``changes``."""
    config_file = directory / "adapter_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **changes}))
    return directory
