"""Adapter archives for upload tests: a rank-4 LoRA of the tiny test model's ``q_proj``
(tools/gateway_cost/server.py writes that model), as the admin API and console take them."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
from safetensors.numpy import save as save_tensors

RANK = 4


def tiny_adapter_archive(seed: int = 0) -> bytes:
    """The adapter as a .tar.gz, its weights drawn from ``seed``."""
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    rng = np.random.default_rng(seed)
    files = {
        "adapter_config.json": json.dumps(
            {"peft_type": "LORA", "r": RANK, "lora_alpha": 8, "target_modules": ["q_proj"]}
        ).encode(),
        "adapter_model.safetensors": save_tensors(
            {
                f"{prefix}.lora_A.weight": rng.standard_normal((RANK, 8)).astype(np.float32),
                f"{prefix}.lora_B.weight": rng.standard_normal((8, RANK)).astype(np.float32),
            }
        ),
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
