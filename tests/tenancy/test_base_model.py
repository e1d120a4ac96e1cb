"""A front checks uploads against a hub model's headers without downloading its weights."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import huggingface_hub
import pytest
from huggingface_hub.utils import SafetensorsFileMetadata, SafetensorsRepoMetadata, TensorInfo

from app.settings import EMBEDDED_MODEL_DIR, MODEL_FILES_WITHOUT_WEIGHTS, Settings
from app.tenancy.base_model import BaseModelInfo


def headers_as_the_hub_serves_them(model_dir: Path) -> SafetensorsRepoMetadata:
    """The repository metadata huggingface_hub builds from each file's header bytes."""
    files: dict[str, SafetensorsFileMetadata] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        metadata = header.pop("__metadata__", {})
        tensors = {
            name: TensorInfo(dtype=t["dtype"], shape=t["shape"], data_offsets=t["data_offsets"])
            for name, t in header.items()
        }
        files[path.name] = SafetensorsFileMetadata(metadata=metadata, tensors=tensors)
    weight_map = {name: file for file, meta in files.items() for name in meta.tensors}
    return SafetensorsRepoMetadata(
        metadata=None, sharded=False, weight_map=weight_map, files_metadata=files
    )


def test_a_hub_models_info_comes_from_its_headers_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    served = headers_as_the_hub_serves_them(EMBEDDED_MODEL_DIR)
    monkeypatch.setattr(huggingface_hub, "get_safetensors_metadata", lambda repo: served)
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    (config_only / "config.json").write_bytes((EMBEDDED_MODEL_DIR / "config.json").read_bytes())

    remote = BaseModelInfo.from_hub("HuggingFaceTB/SmolLM2-135M-Instruct", config_only)
    local = BaseModelInfo.from_model_dir(EMBEDDED_MODEL_DIR)
    assert remote.name_or_path == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert (remote.linear_shapes, remote.num_layers) == (local.linear_shapes, local.num_layers)
    assert remote.modules == local.modules
    assert "q_proj" in remote.linear_shapes


def test_the_front_fetches_a_hub_models_files_but_not_its_weights(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    asked: list[dict[str, Any]] = []

    def snapshot_download(repo_id: str, **options: Any) -> str:
        asked.append({"repo_id": repo_id, **options})
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    settings = Settings(_env_file=None, model="org/model")  # type: ignore[call-arg]
    assert settings.model_dir(weights=False) == tmp_path
    assert settings.model_dir() == tmp_path
    without, everything = asked
    assert without["allow_patterns"] == list(MODEL_FILES_WITHOUT_WEIGHTS)
    assert not any(p.endswith((".safetensors", ".bin")) for p in without["allow_patterns"])
    assert everything["allow_patterns"] is None
