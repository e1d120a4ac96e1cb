"""What adapters are checked against: the base model's linear layers, read from its
config.json and safetensors headers (never its tensors)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from safetensors import safe_open

from app.tenancy.adapters import AdapterError

# Modules LoRA never targets here: embeddings and the output head.
_NOT_LORA_TARGETS = ("embed", "lm_head", "wte", "wpe")


@dataclass(frozen=True)
class BaseModelInfo:
    """The linear layers of the base model that adapters are checked against.

    ``linear_shapes`` maps each module suffix LoRA may target (``q_proj``) to
    ``(out_features, in_features)``. ``modules`` maps full module paths
    (``model.layers.0.self_attn.q_proj``) to shapes; when empty, tensors are matched by
    suffix and layer index only.
    """

    name_or_path: str
    linear_shapes: Mapping[str, tuple[int, int]]
    num_layers: int
    modules: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> BaseModelInfo:
        """Read a local HF model dir's config.json and safetensors headers (never tensors)."""
        try:
            config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
            num_layers = int(config.get("text_config", config)["num_hidden_layers"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise AdapterError(f"{model_dir}: unreadable base model config.json: {exc}") from exc
        modules: dict[str, tuple[int, int]] = {}
        for file in sorted(model_dir.glob("*.safetensors")):
            with safe_open(file, framework="np") as handle:
                for key in handle.keys():  # noqa: SIM118 - safe_open is not a Mapping
                    shape = handle.get_slice(key).get_shape()
                    excluded = any(part in key for part in _NOT_LORA_TARGETS)
                    if key.endswith(".weight") and len(shape) == 2 and not excluded:
                        modules[key.removesuffix(".weight")] = (shape[0], shape[1])
        if not modules:
            raise AdapterError(f"{model_dir}: no linear layers found in *.safetensors")
        suffixes: dict[str, tuple[int, int]] = {}
        for path, shape in modules.items():
            suffixes.setdefault(path.rsplit(".", 1)[-1], shape)
        return cls(str(model_dir), suffixes, num_layers, modules)
