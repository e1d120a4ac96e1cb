"""vLLM's adapter loads read the weights file with one system call per tensor: the same
tensors as safetensors' own reader gives, or safetensors' own reader where this one cannot."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import safetensors
import torch
from safetensors.torch import save_file

from app.inside_vllm import adapter_files
from app.inside_vllm.adapter_files import AdapterWeightsFile, Safetensors, safe_open
from app.settings import EMBEDDED_MODEL_DIR
from bench.random_adapters import make_random_adapter

MIXED = {
    "b.lora_B.weight": torch.arange(24, dtype=torch.float32).reshape(4, 6),
    "a.lora_A.weight": torch.linspace(-1, 1, 30, dtype=torch.bfloat16).reshape(3, 10),
    "half": torch.tensor([[1.5, -2.25]], dtype=torch.float16),
    "double": torch.tensor([1e300], dtype=torch.float64),
    "ids": torch.arange(-3, 3, dtype=torch.int64),
    "small": torch.tensor([1, -2, 3], dtype=torch.int8),
    "bytes": torch.tensor([0, 255], dtype=torch.uint8),
    "mask": torch.tensor([True, False, True]),
    "scalar": torch.tensor(7, dtype=torch.int32),
    "empty": torch.empty(0, 5, dtype=torch.float32),
}


def read_all(opened: object) -> dict[str, torch.Tensor]:
    with opened as f:  # type: ignore[attr-defined]
        return {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype, name
        assert got[name].shape == tensor.shape, name
        assert torch.equal(got[name], tensor), name


def test_every_mapped_dtype_and_shape_reads_as_safetensors_reads_it(tmp_path: Path) -> None:
    path = str(tmp_path / "adapter_model.safetensors")
    save_file(MIXED, path, metadata={"format": "pt"})
    opened = safe_open(path, framework="pt")
    assert isinstance(opened, AdapterWeightsFile)
    assert_same(read_all(opened), read_all(safetensors.safe_open(path, framework="pt")))


def test_each_tensor_has_its_own_writable_memory(tmp_path: Path) -> None:
    path = str(tmp_path / "w.safetensors")
    save_file({"x": torch.zeros(4), "y": torch.zeros(4)}, path)
    with safe_open(path, framework="pt") as f:
        x, y, x_again = f.get_tensor("x"), f.get_tensor("y"), f.get_tensor("x")
    x += 1  # vLLM scales B in place once loaded
    assert y.tolist() == [0.0] * 4 and x_again.tolist() == [0.0] * 4
    assert read_all(safe_open(path, framework="pt"))["x"].tolist() == [0.0] * 4


def test_a_dtype_it_does_not_map_goes_to_safetensors(tmp_path: Path) -> None:
    path = str(tmp_path / "f8.safetensors")
    tensors = {"w": torch.tensor([0.5, -1.0]).to(torch.float8_e4m3fn)}
    save_file(tensors, path)
    opened = safe_open(path, framework="pt")
    assert not isinstance(opened, AdapterWeightsFile)
    got = read_all(opened)["w"]
    assert got.dtype == torch.float8_e4m3fn and got.float().tolist() == [0.5, -1.0]


def header_file(path: Path, header: dict[str, object], data: bytes) -> str:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return str(path)


@pytest.mark.parametrize(
    "header",
    [
        {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 12]}},  # past the end
        {"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},  # shape and size differ
        {"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}},
        {"w": {"dtype": "F32", "shape": [2]}},
        {"w": ["F32"]},
    ],
)
def test_a_header_that_does_not_add_up_is_refused_by_safetensors(
    tmp_path: Path, header: dict[str, object]
) -> None:
    path = header_file(tmp_path / "bad.safetensors", header, bytes(8))
    assert AdapterWeightsFile.open(path) is None
    with pytest.raises(safetensors.SafetensorError):
        read_all(safe_open(path, framework="pt"))


def test_a_file_shorter_than_its_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "short.safetensors"
    path.write_bytes(struct.pack("<Q", 1000) + b"{}")
    assert AdapterWeightsFile.open(str(path)) is None
    path.write_bytes(b"\x01")
    assert AdapterWeightsFile.open(str(path)) is None


def test_vllm_loads_an_adapter_through_it_to_the_same_weights(tmp_path: Path) -> None:
    from vllm.lora import lora_model
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    adapter = make_random_adapter(
        EMBEDDED_MODEL_DIR, tmp_path / "a", rank=8, target_modules=["q_proj", "v_proj"], seed=3
    )

    def load() -> LoRAModel:
        return LoRAModel.from_local_checkpoint(
            str(adapter),
            {"q_proj", "v_proj"},
            PEFTHelper.from_local_dir(str(adapter), 8192),
            lora_model_id=1,
            device="cpu",
            dtype=torch.float32,
        )

    shipped = lora_model.safetensors
    try:
        lora_model.safetensors = safetensors  # type: ignore[assignment]
        want = load()
        adapter_files.install()
        adapter_files.install()
        assert isinstance(lora_model.safetensors, Safetensors)
        assert lora_model.safetensors.safe_open is safe_open
        assert lora_model.safetensors.SafetensorError is safetensors.SafetensorError
        got = load()
    finally:
        lora_model.safetensors = shipped
    assert sorted(got.loras) == sorted(want.loras) and len(want.loras) == 2 * 30
    for name, weights in want.loras.items():
        assert torch.equal(got.loras[name].lora_a, weights.lora_a), name
        assert torch.equal(got.loras[name].lora_b, weights.lora_b), name
