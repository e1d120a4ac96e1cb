"""What adapters are checked against: the base model's linear layers, read from its
config.json and safetensors headers (never its tensors)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from safetensors import safe_open

from app.settings import Settings
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

        def shapes() -> Iterator[tuple[str, Sequence[int]]]:
            for file in sorted(model_dir.glob("*.safetensors")):
                with safe_open(file, framework="np") as handle:
                    for key in handle.keys():  # noqa: SIM118 - safe_open is not a Mapping
                        yield key, handle.get_slice(key).get_shape()

        return cls._from_headers(model_dir, shapes())

    @classmethod
    def from_hub(cls, repo_id: str, config_dir: Path) -> BaseModelInfo:
        """A hub model's info from ``config_dir`` (its config, without weights) and its
        safetensors headers read over HTTP: a front checks uploads without holding the
        weights."""
        from huggingface_hub import get_safetensors_metadata

        files = get_safetensors_metadata(repo_id).files_metadata.values()
        shapes = ((key, info.shape) for file in files for key, info in file.tensors.items())
        return cls._from_headers(config_dir, shapes, name_or_path=repo_id)

    @classmethod
    def _from_headers(
        cls,
        config_dir: Path,
        shapes: Iterable[tuple[str, Sequence[int]]],
        name_or_path: str | None = None,
    ) -> BaseModelInfo:
        try:
            config = json.loads((config_dir / "config.json").read_text(encoding="utf-8"))
            num_layers = int(config.get("text_config", config)["num_hidden_layers"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise AdapterError(f"{config_dir}: unreadable base model config.json: {exc}") from exc
        modules: dict[str, tuple[int, int]] = {}
        for key, shape in shapes:
            excluded = any(part in key for part in _NOT_LORA_TARGETS)
            if key.endswith(".weight") and len(shape) == 2 and not excluded:
                modules[key.removesuffix(".weight")] = (shape[0], shape[1])
        if not modules:
            raise AdapterError(f"{name_or_path or config_dir}: no linear layers in *.safetensors")
        suffixes: dict[str, tuple[int, int]] = {}
        for path, shape in modules.items():
            suffixes.setdefault(path.rsplit(".", 1)[-1], shape)
        return cls(name_or_path or str(config_dir), suffixes, num_layers, modules)

    @classmethod
    def for_settings(cls, settings: Settings) -> BaseModelInfo:
        """The configured base model's info: from its directory, or, for a hub id, from its
        config and remote headers (its weights are not downloaded for this)."""
        if Path(settings.model).is_dir():
            return cls.from_model_dir(Path(settings.model))
        return cls.from_hub(settings.model, settings.model_dir(weights=False))
