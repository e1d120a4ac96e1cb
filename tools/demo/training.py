"""Train the three demo LoRA adapters with a short, seeded run on synthetic chats.

Each adapter learns one recognisable answer style from ``training_data`` (a legal
analysis, a SOAP note, a call-centre reply) in a fixed number of AdamW steps
on the CPU, in float32, so the set-up needs no GPU and no download. The same
seed gives byte-identical adapters on the same machine: data, LoRA
initialisation and training are all seeded, and training runs with
deterministic algorithms on a fixed single thread.

An adapter is finished when ``adapter_root/<name>/`` holds ``adapter_config.json``
and ``adapter_model.safetensors``. It is written to ``<name>.partial`` first and
renamed last, so an interrupted run never looks finished.
"""

from __future__ import annotations

import random
import shutil
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.demo import progress
from tools.demo.training_data import chat_examples

if TYPE_CHECKING:
    import torch

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
ALL_LINEAR = (*ATTENTION, "gate_proj", "up_proj", "down_proj")

# Sized for about a minute per adapter on one CPU core; enough for the style
# to dominate greedy decoding of unseen questions.
STEPS = 20
BATCH_SIZE = 4
WARMUP_STEPS = 3
IGNORE = -100


@dataclass(frozen=True)
class AdapterSpec:
    name: str
    rank: int
    target_modules: tuple[str, ...]
    learning_rate: float


SPECS: dict[str, AdapterSpec] = {
    spec.name: spec
    for spec in (
        AdapterSpec("legal_advisor", 16, ALL_LINEAR, 3e-3),
        # Rank 8 on attention alone has far fewer weights to carry the style,
        # so it takes larger steps to learn it in the same number of them.
        AdapterSpec("medical_scribe", 8, ATTENTION, 5e-3),
        AdapterSpec("telephony_support", 32, ALL_LINEAR, 3e-3),
    )
}
# The demo adapters' names, in one place: the tenant manifests in tenants/ grant them, the
# Makefile reads them (with the interpreter that creates the venv: this module imports only
# the standard library at load, and torch, transformers and peft when training).
DEMO_ADAPTERS: tuple[str, ...] = tuple(SPECS)


def is_built(adapter_dir: Path) -> bool:
    return all((adapter_dir / file).is_file() for file in ADAPTER_FILES)


def build_demo_adapters(
    model_dir: Path, adapter_root: Path, *, seed: int = 0, force: bool = False
) -> list[Path]:
    """Train the missing demo adapters into adapter_root/<name>/ (idempotent: a finished
    adapter is skipped unless force).

    Returns the directories of all demo adapters, in ``DEMO_ADAPTERS`` order.
    Each adapter's data and initialisation depend only on ``seed`` and its name,
    so skipping or rebuilding one never changes another.
    """
    targets = [adapter_root / name for name in DEMO_ADAPTERS]
    for name, target in zip(DEMO_ADAPTERS, targets, strict=True):
        if is_built(target) and not force:
            progress.say(f"adapter {name}: {target} is ready")
            continue
        with progress.step(f"adapter {name}: training rank {SPECS[name].rank}"):
            _build(SPECS[name], model_dir, target, seed)
    return targets


def _build(spec: AdapterSpec, model_dir: Path, target: Path, seed: int) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_id = f"{seed}:{spec.name}"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    chats = chat_examples(spec.name, STEPS * BATCH_SIZE, random.Random(run_id))
    batches = [
        _collate([_encode(tokenizer, chat) for chat in chats[i : i + BATCH_SIZE]], tokenizer)
        for i in range(0, len(chats), BATCH_SIZE)
    ]

    with _deterministic(zlib.crc32(run_id.encode())):
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        config = LoraConfig(
            r=spec.rank,
            lora_alpha=2 * spec.rank,
            lora_dropout=0.0,
            target_modules=list(spec.target_modules),
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(base, config)
        _train(model, batches, spec.learning_rate, spec.name)
    _save(model, spec, model_dir.name, target)


def _save(model: Any, spec: AdapterSpec, base_name: str, target: Path) -> None:
    """Write the adapter's two files to ``<target>.partial`` and rename it to ``target``."""
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    saved = model.peft_config["default"]
    # A relative name, not this machine's path, so the adapter can be moved.
    saved.base_model_name_or_path = base_name
    # PEFT keeps the modules as a set, whose order would vary with the hash seed.
    saved.target_modules = sorted(spec.target_modules)
    # The embeddings are not trained; "auto" would look the base name up on the Hub.
    model.save_pretrained(str(staging), safe_serialization=True, save_embedding_layers=False)
    for extra in staging.iterdir():  # PEFT adds a README model card
        if extra.name not in ADAPTER_FILES:
            extra.unlink()
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)


def _train(
    model: Any, batches: list[dict[str, torch.Tensor]], learning_rate: float, label: str
) -> None:
    """Fixed-step AdamW with a short warmup and linear decay, loss on answer tokens only."""
    import torch
    import torch.nn.functional as F

    causal_lm = model.get_base_model()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: min((step + 1) / WARMUP_STEPS, (len(batches) - step) / len(batches)),
    )
    model.train()
    progress.bar(label, 0, len(batches))
    for step, batch in enumerate(batches, start=1):
        hidden = causal_lm.model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        ).last_hidden_state
        # Position t predicts token t+1; only answer positions go through the
        # 49k-wide head, which saves a large share of each step.
        targets = batch["labels"][:, 1:]
        scored = targets != IGNORE
        logits = causal_lm.lm_head(hidden[:, :-1][scored])
        loss = F.cross_entropy(logits, targets[scored])
        torch.autograd.backward(loss)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        progress.bar(label, step, len(batches), f"loss {loss.item():.3f}")
    model.eval()


def _encode(tokenizer: Any, chat: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """Token ids of a chat and its labels: the answer and its end token, the rest ignored."""
    prompt: list[int] = tokenizer.apply_chat_template(
        chat[:-1], add_generation_prompt=True, return_dict=False
    )
    answer: list[int] = tokenizer(chat[-1]["content"], add_special_tokens=False)["input_ids"]
    answer.append(tokenizer.eos_token_id)
    return prompt + answer, [IGNORE] * len(prompt) + answer


def _collate(encoded: list[tuple[list[int], list[int]]], tokenizer: Any) -> dict[str, torch.Tensor]:
    import torch

    width = max(len(ids) for ids, _ in encoded)
    pad = tokenizer.pad_token_id
    rows = [
        (
            ids + [pad] * (width - len(ids)),
            [1] * len(ids) + [0] * (width - len(ids)),
            labels + [IGNORE] * (width - len(ids)),
        )
        for ids, labels in encoded
    ]
    input_ids, attention_mask, labels = (torch.tensor(column) for column in zip(*rows, strict=True))
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


@contextmanager
def _deterministic(seed: int) -> Iterator[None]:
    """Seed torch, enforce deterministic kernels and use one thread; restore both after.

    One thread because at this model size a second one gains under 2x on idle
    cores, while on busy ones (the engine or tests running) threads that wait
    on each other make every step 10x slower or worse. A fixed count also
    keeps the bytes independent of the machine's core count.
    """
    import torch

    was_deterministic = torch.are_deterministic_algorithms_enabled()
    threads = torch.get_num_threads()
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(was_deterministic)
