"""Upload validation refuses every adapter config vLLM's own loader would refuse.

vLLM reads an adapter's config with ``PEFTHelper`` (vllm/lora/peft_helper.py) inside the
engine's step, and a refusal there used to kill the engine. Every field ``PEFTHelper``
declares is probed here with values it refuses; our validator must refuse each of them too,
naming the field. A field vLLM adds is not probed: the test says so and fails, so that a new
refusal is never left unmirrored.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from vllm.config.lora import LoRAConfig
from vllm.lora.peft_helper import PEFTHelper

from app.tenancy.adapters import AdapterError
from app.tenancy.base_model import BaseModelInfo
from tests.support.adapter_dirs import MAX_RANK, fake_base_model, make_adapter, validate


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()
"""The key is absent from adapter_config.json."""

PROBES: dict[str, list[Any]] = {
    "r": [MISSING, 0, -1, MAX_RANK + 1, 2.5],
    "lora_alpha": [MISSING, None, 0, -8],
    "target_modules": [MISSING, None],
    "bias": ["all", "lora_only"],
    "modules_to_save": [["classifier"], ["lm_head"], ["score"]],
    "use_rslora": [True],
    "use_dora": [True],
    "lora_bias": [True],
    "init_lora_weights": ["pissa", "olora", "PiSSA_niter_4", "loftq", "corda", "gaussian", False],
    "alora_invocation_tokens": [[1, 2]],
    "layer_replication": [[[0, 1], [0, 2]]],
    "use_bdlora": [{"block_size": 2}, {"enabled": True}],
    "use_qalora": [True],
    "rank_pattern": [{"q_proj": MAX_RANK + 1}, {"q_proj": 0}, {"q_proj": 2}],
    "alpha_pattern": [{"q_proj": 2.0}],
    "vllm_lora_scaling_factor": [3.0],
    "vllm_max_position_embeddings": [16],
}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> BaseModelInfo:
    return fake_base_model(tmp_path_factory.mktemp("models"))


def engine_lora_config() -> LoRAConfig:
    return LoRAConfig(max_lora_rank=MAX_RANK, max_loras=1)


def vllm_refusal(config: dict[str, Any]) -> str | None:
    """What vLLM's loader says against ``config`` (as it reads it), ``None`` if it takes it."""
    try:
        PEFTHelper.from_dict(config).validate_legal(engine_lora_config())
    except (ValueError, TypeError) as exc:
        return str(exc)
    return None


def test_every_field_vllm_checks_is_probed() -> None:
    fields = {field.name for field in dataclasses.fields(PEFTHelper)}
    assert fields - PROBES.keys() == set(), (
        "vLLM's PEFTHelper reads fields this test does not probe: add values it refuses "
        "to PROBES (and make the validator refuse them)"
    )


CASES = [(field, value) for field, values in PROBES.items() for value in values]


@pytest.mark.parametrize(
    ("field", "value"), CASES, ids=[f"{field}={value!r}" for field, value in CASES]
)
def test_what_vllm_refuses_is_refused_at_upload_naming_the_field(
    tmp_path: Path, base: BaseModelInfo, field: str, value: Any
) -> None:
    directory = make_adapter(tmp_path)
    config_file = directory / "adapter_config.json"
    config = json.loads(config_file.read_text())
    if value is MISSING:
        config.pop(field, None)
    else:
        config[field] = value
    config_file.write_text(json.dumps(config))
    refusal = vllm_refusal(config)
    if refusal is None:
        return  # vLLM takes it; the validator may still refuse what this server does not serve
    with pytest.raises(AdapterError) as refused:
        validate(directory, base)
    assert field in str(refused.value), (field, value, str(refused.value), refusal)


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"lora_alpha": None}, "lora_alpha"),
        ({"lora_bias": True}, "vLLM does not support LoRA bias"),
        ({"init_lora_weights": "pissa"}, "init_lora_weights"),
        ({"init_lora_weights": "olora"}, "init_lora_weights"),
        ({"use_qalora": True}, "QALoRA"),
        ({"use_bdlora": {"block_size": 2}}, "BD-LoRA"),
    ],
)
def test_the_red_team_configs_are_refused(
    tmp_path: Path, base: BaseModelInfo, config: dict[str, Any], says: str
) -> None:
    """The configs of issue #48 that passed the upload check and then killed the engine."""
    with pytest.raises(AdapterError, match=says):
        validate(make_adapter(tmp_path, **config), base)


def test_a_config_vllm_takes_still_passes(tmp_path: Path, base: BaseModelInfo) -> None:
    directory = make_adapter(tmp_path, init_lora_weights="gaussian", use_rslora=True)
    assert validate(directory, base).rank == 4


def test_processes_that_only_fetch_stored_content_start_without_vllm() -> None:
    """vLLM is imported where a config is checked, not with the storage modules: the cold-load
    processes (tests/support/cold_load.py, as an engine host's) would spend seconds on it."""
    probe = "import sys, tests.support.cold_load; print('vllm' in sys.modules)"
    found = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=Path.cwd()
    )
    assert found.stdout.strip() == "False", found.stderr
