"""Checks an uploaded LoRA adapter must pass before anything of it is stored.

Only metadata is read: JSON and safetensors headers; tensor data is never loaded and nothing
is unpickled. Each rejection is an ``AdapterError`` whose message is for the admin who
uploaded the adapter: it names files, tensors and modules, not server paths. Archives are
unpacked by :mod:`app.tenancy.archive` first; the base model is read by
:mod:`app.tenancy.base_model`.

The config is also put to vLLM's own reader (``PEFTHelper``, what the engine's worker reads
it with before it loads the weights) under the engine's LoRA limits: an adapter it would
refuse is refused here, naming the field, instead of failing later inside the engine.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import regex
from safetensors import SafetensorError, safe_open

from app.tenancy.adapters import CONFIG_FILE, WEIGHTS_FILE, AdapterError, content_sha256
from app.tenancy.base_model import BaseModelInfo

if TYPE_CHECKING:
    from vllm.config.lora import LoRAConfig

ALLOWED_FILES = (CONFIG_FILE, WEIGHTS_FILE, "README.md", ".gitattributes")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
TENSOR_DTYPES = ("F16", "BF16", "F32")
_UNSERVED = {
    "use_dora": "DoRA adapters are not served",
    "modules_to_save": "only LoRA weights are served, not full copies of base model modules",
    "layers_to_transform": "every layer of each targeted module must be adapted",
    "rank_pattern": "every module must use the same rank",
    "alpha_pattern": "every module must use the same lora_alpha",
    "layer_replication": "base model layers cannot be replicated",
    "alora_invocation_tokens": "activated LoRA (aLoRA) is not served",
    "target_parameters": "only linear layers can be adapted, not raw parameters",
    "trainable_token_indices": "embedding rows cannot be trained",
}
_TENSOR_NAME = re.compile(r"base_model\.model\.(?P<module>.+)\.lora_(?P<kind>[AB])\.weight")
_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")
# A string target_modules is a regular expression run against every module name of the base
# model: it is compiled with `regex`, whose matcher can be stopped, and all its matches
# together get this many seconds, so a pattern that backtracks catastrophically is refused
# instead of holding a thread (and the GIL) for minutes.
TARGET_PATTERN_BUDGET_S = 0.5
MAX_TARGET_PATTERN_LENGTH = 1000


@dataclass(frozen=True)
class ValidatedAdapter:
    """What validation learned about an adapter directory that may be stored as it is."""

    rank: int
    lora_alpha: float
    target_modules: tuple[str, ...]
    size_bytes: int
    sha256: str


def validate_adapter_dir(
    directory: Path, base: BaseModelInfo, *, max_rank: int, max_bytes: int
) -> ValidatedAdapter:
    """Check a PEFT LoRA directory against ``base``; raise ``AdapterError`` at the first problem.

    Accepted: exactly adapter_config.json and adapter_model.safetensors (README.md and
    .gitattributes allowed), no links, at most ``max_bytes`` in all, a LORA config of rank
    at most ``max_rank`` without features this server does not serve, and only correctly
    shaped lora_A/lora_B pairs for linear layers of ``base`` that target_modules selects.
    ``target_modules`` of the result are the selected module suffixes, sorted.
    """
    size = _check_files(directory, max_bytes)
    config = _read_config(directory)
    rank, alpha = _check_hyperparameters(config, max_rank)
    claimed = config.get("base_model_name_or_path")
    if claimed and not _same_model(str(claimed), base.name_or_path):
        raise AdapterError(
            f"the adapter was trained for base model {claimed!r}, "
            f"but this server serves {_model_name(base.name_or_path)!r}"
        )
    select = _TargetSelector(config.get("target_modules"))
    targeted = _check_targets(select, list(base.modules) or list(base.linear_shapes), base)
    _check_tensors(directory / WEIGHTS_FILE, base, rank, select)
    check_vllm_rules(config, max_rank)  # the last word, after the checks that say more
    suffixes = tuple(sorted({module.rsplit(".", 1)[-1] for module in targeted}))
    return ValidatedAdapter(rank, alpha, suffixes, size, content_sha256(directory))


def _check_files(directory: Path, max_bytes: int) -> int:
    if directory.is_symlink() or not directory.is_dir():
        raise AdapterError("the adapter is not a directory")
    links, pickles, unexpected, total = [], [], [], 0
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            info = Path(root, name).lstat()
            relative = Path(root, name).relative_to(directory).as_posix()
            if stat.S_ISLNK(info.st_mode):
                links.append(relative)
            elif name.lower().endswith(PICKLE_SUFFIXES):
                pickles.append(relative)
            elif relative not in ALLOWED_FILES or not stat.S_ISREG(info.st_mode):
                unexpected.append(relative)
            total += info.st_size if stat.S_ISREG(info.st_mode) else 0
    if links:
        raise AdapterError(f"symbolic links are not accepted: {', '.join(sorted(links))}")
    if pickles:
        names = ", ".join(sorted(pickles))
        raise AdapterError(
            f"pickle-based weights are not accepted; convert to safetensors: {names}"
        )
    if unexpected:
        names, allowed = ", ".join(sorted(unexpected)), ", ".join(ALLOWED_FILES)
        raise AdapterError(f"unexpected files: {names} (only {allowed} are accepted)")
    if not (directory / WEIGHTS_FILE).is_file():
        raise AdapterError(f"{WEIGHTS_FILE} is missing (weights are accepted only as safetensors)")
    if total > max_bytes:
        raise AdapterError(f"the adapter is {total} bytes, over the limit of {max_bytes} bytes")
    return total


def _read_config(directory: Path) -> dict[str, Any]:
    if not (directory / CONFIG_FILE).is_file():
        raise AdapterError(f"{CONFIG_FILE} is missing")
    try:
        config = json.loads((directory / CONFIG_FILE).read_text(encoding="utf-8"))
    except OSError as exc:
        raise AdapterError(f"{CONFIG_FILE} is unreadable: {exc.strerror}") from exc
    except ValueError as exc:
        raise AdapterError(f"{CONFIG_FILE} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise AdapterError(f"{CONFIG_FILE} must hold a JSON object")
    return config


def _check_hyperparameters(config: dict[str, Any], max_rank: int) -> tuple[int, float]:
    if (peft_type := config.get("peft_type")) != "LORA":
        raise AdapterError(f"peft_type is {peft_type!r}; only LORA adapters are served")
    rank = config.get("r")
    if rank is None:
        raise AdapterError("the LoRA rank (r) is missing")
    if not isinstance(rank, int) or isinstance(rank, bool):
        raise AdapterError(f"the LoRA rank (r) must be an integer, not {rank!r}")
    if not 1 <= rank <= max_rank:
        raise AdapterError(f"the LoRA rank (r) is {rank}; it must be between 1 and {max_rank}")
    if "lora_alpha" not in config:  # PEFT defaults it, vLLM's reader requires it
        raise AdapterError("lora_alpha is missing")
    alpha = config["lora_alpha"]
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise AdapterError(f"lora_alpha must be a number, not {alpha!r}")
    if alpha <= 0:
        raise AdapterError(f"lora_alpha must be positive, not {alpha}")
    for key, reason in _UNSERVED.items():
        value = config.get(key)
        if value is not None and value is not False and value not in ([], {}):
            raise AdapterError(f"{key}={value!r} is not supported: {reason}")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"bias={config['bias']!r} is not supported: only 'none' is served")
    return rank, float(alpha)


def engine_lora_config(max_rank: int) -> LoRAConfig:
    """The engine's LoRA limits as vLLM's reader checks them: the engine is built with
    ``max_lora_rank`` = the same setting (app/engine/vllm_engine.py), the one field
    ``PEFTHelper.validate_legal`` reads. vLLM is imported here, not with this module: the
    processes that only fetch stored content (app/tenancy/storage) start without it."""
    from vllm.config.lora import LoRAConfig

    return LoRAConfig(max_lora_rank=max_rank)  # type: ignore[arg-type]


def vllm_refusal(config: dict[str, Any], lora_config: LoRAConfig) -> str | None:
    """What vLLM's adapter reader says against ``config``; ``None`` when it takes it."""
    from vllm.lora.peft_helper import PEFTHelper

    try:
        PEFTHelper.from_dict(dict(config)).validate_legal(lora_config)
    except (ValueError, TypeError, AttributeError) as exc:  # TypeError: a value of a wrong type
        return str(exc) or type(exc).__name__
    return None


def check_vllm_rules(config: dict[str, Any], max_rank: int) -> None:
    """Refuse, naming the field, a config vLLM's reader refuses under the engine's limits.

    The field is found by asking the reader again without each key it reads: the ones whose
    absence it takes are named (all of them when no single one is to blame)."""
    from vllm.lora.peft_helper import PEFTHelper

    lora_config = engine_lora_config(max_rank)
    refusal = vllm_refusal(config, lora_config)
    if refusal is None:
        return
    read = [field.name for field in dataclasses.fields(PEFTHelper) if field.name in config]
    blamed = [
        key
        for key in read
        if vllm_refusal({k: v for k, v in config.items() if k != key}, lora_config) is None
    ]
    named = ", ".join(f"{key}={config[key]!r}" for key in blamed or read)
    raise AdapterError(f"{named}: the engine (vLLM) refuses this adapter: {refusal}")


def check_engine_rules(directory: Path, max_rank: int) -> None:
    """Refuse a stored adapter's config that vLLM's reader would refuse (:func:`check_vllm_rules`):
    for versions stored before the upload check asked it, read where the engine reads them."""
    check_vllm_rules(_read_config(directory), max_rank)


def _model_name(name_or_path: str) -> str:
    return name_or_path.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]


def _same_model(claimed: str, ours: str) -> bool:
    """Equal, or the same final path component (HF repo name), ignoring case."""
    return claimed == ours or _model_name(claimed).lower() == _model_name(ours).lower()


class _TargetSelector:
    """PEFT's reading of target_modules: a string is a regular expression that must match a
    whole module name; a list entry matches a module name or its last dotted components.

    A pattern's matches share one time budget (``TARGET_PATTERN_BUDGET_S``) and run with the
    GIL released; ``AdapterError`` says when it is spent.
    """

    def __init__(self, targets: object) -> None:
        self.names: tuple[str, ...] = ()
        self.pattern: Any = None
        if isinstance(targets, str) and targets:
            if len(targets) > MAX_TARGET_PATTERN_LENGTH:
                raise AdapterError(
                    f"the target_modules regex is over {MAX_TARGET_PATTERN_LENGTH} characters; "
                    "list the module names instead"
                )
            try:
                self.pattern = regex.compile(targets)
            except regex.error as exc:
                raise AdapterError(
                    f"target_modules {targets!r} is not a valid regex: {exc}"
                ) from exc
        elif isinstance(targets, list) and targets:
            if not all(isinstance(target, str) and target for target in targets):
                raise AdapterError(
                    f"target_modules must be a list of module names, not {targets!r}"
                )
            self.names = tuple(targets)
        else:
            raise AdapterError("target_modules is missing or empty")
        self._deadline = time.monotonic() + TARGET_PATTERN_BUDGET_S
        self._decided: dict[str, bool] = {}

    def __call__(self, module: str) -> bool:
        if self.pattern is None:
            return any(module == name or module.endswith(f".{name}") for name in self.names)
        if module not in self._decided:
            timeout = max(self._deadline - time.monotonic(), 0.0)
            try:
                found = self.pattern.fullmatch(module, timeout=timeout, concurrent=True)
            except TimeoutError as exc:
                raise AdapterError(
                    f"the target_modules regex {self.pattern.pattern!r} takes too long to match "
                    "the base model's module names; list the module names instead"
                ) from exc
            self._decided[module] = found is not None
        return self._decided[module]


def _check_targets(select: _TargetSelector, universe: list[str], base: BaseModelInfo) -> list[str]:
    available = f"(linear layers: {', '.join(sorted(base.linear_shapes))})"
    targeted = [module for module in universe if select(module)]
    if select.pattern is not None and not targeted:
        raise AdapterError(
            f"target_modules regex {select.pattern.pattern!r} matches no linear layer of the "
            f"base model {available}"
        )
    unknown = [
        name for name in select.names if not any(_TargetSelector([name])(m) for m in universe)
    ]
    if unknown:
        raise AdapterError(
            "target_modules names modules that are not linear layers of the base model: "
            f"{', '.join(unknown)} {available}"
        )
    return targeted


def _module_shape(module: str, base: BaseModelInfo) -> tuple[int, int]:
    layer = _LAYER_INDEX.search(module)
    if layer is not None and int(layer[1]) >= base.num_layers:
        raise AdapterError(
            f"{module}: layer {layer[1]} does not exist (the base model has {base.num_layers})"
        )
    if base.modules:
        shape = base.modules.get(module)
    else:
        shape = base.linear_shapes.get(module.rsplit(".", 1)[-1])
    if shape is None:
        raise AdapterError(f"{module} is not a linear layer of the base model")
    return shape


def _check_tensors(path: Path, base: BaseModelInfo, rank: int, select: _TargetSelector) -> None:
    try:
        with safe_open(path, framework="np") as handle:
            header = {
                key: (handle.get_slice(key).get_dtype(), tuple(handle.get_slice(key).get_shape()))
                for key in handle.keys()  # noqa: SIM118 - safe_open is not a Mapping
            }
    except (SafetensorError, OSError, ValueError) as exc:
        raise AdapterError(f"{WEIGHTS_FILE} is not a valid safetensors file: {exc}") from exc
    kinds: dict[str, set[str]] = {}
    for name, (dtype, shape) in sorted(header.items()):
        if (match := _TENSOR_NAME.fullmatch(name)) is None:
            raise AdapterError(
                f"unexpected tensor {name!r}: {WEIGHTS_FILE} may hold only "
                "base_model.model.<module>.lora_A.weight and .lora_B.weight tensors"
            )
        module, kind = match["module"], match["kind"]
        out_features, in_features = _module_shape(module, base)
        if not select(module):
            raise AdapterError(f"tensor {name!r} adapts {module}, which target_modules excludes")
        if dtype not in TENSOR_DTYPES:
            allowed = ", ".join(TENSOR_DTYPES)
            raise AdapterError(f"tensor {name!r} has dtype {dtype}; only {allowed} are accepted")
        expected = (rank, in_features) if kind == "A" else (out_features, rank)
        if shape != expected:
            raise AdapterError(
                f"tensor {name!r} has shape {list(shape)}, expected {list(expected)} "
                f"(rank {rank}, base layer {out_features}x{in_features})"
            )
        kinds.setdefault(module, set()).add(kind)
    if not kinds:
        raise AdapterError(f"{WEIGHTS_FILE} holds no LoRA tensors")
    for module, present in sorted(kinds.items()):
        if present != {"A", "B"}:
            missing = "lora_B" if "A" in present else "lora_A"
            raise AdapterError(f"{module} has no {missing} tensor; lora_A and lora_B come in pairs")
