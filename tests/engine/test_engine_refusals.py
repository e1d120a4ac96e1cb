"""What vLLM raises about a request becomes a 400 before any output, and a dead engine a 503
(``VLLMEngine.generate`` over a stand-in for vLLM's AsyncLLM: the mapping, not the engine);
and the check that refuses to start the engine on CPU without the isolation fix."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from importlib import metadata
from types import SimpleNamespace
from typing import Any

import pytest
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

from app.engine.vllm_engine import VLLMEngine
from app.errors import BadRequestError, EngineUnavailableError
from app.inside_vllm import plugin as vllm_plugin
from app.inside_vllm.plugin import IsolationFixUnavailable, require_isolation_fix


class FailingLLM:
    """Yields ``before`` outputs, then raises ``error``."""

    def __init__(self, error: BaseException, before: int = 0) -> None:
        self.model_config = SimpleNamespace(max_model_len=64)
        self.error = error
        self.before = before

    async def generate(self, *_: Any, **__: Any) -> AsyncIterator[str]:
        for n in range(self.before):
            yield f"output {n}"
        raise self.error


async def run(llm: FailingLLM) -> list[Any]:
    engine = VLLMEngine(llm)  # type: ignore[arg-type]
    return [o async for o in engine.generate([1, 2], SamplingParams(), "r", None)]


def wrapped(cause: BaseException) -> EngineGenerateError:
    # How AsyncLLM.generate reports what its input processing raised.
    try:
        raise EngineGenerateError() from cause
    except EngineGenerateError as exc:
        return exc


@pytest.mark.parametrize(
    ("error", "param", "says"),
    [
        (
            VLLMValidationError("top_p must be in (0, 1], got 2.", parameter="top_p"),
            "top_p",
            "top_p",
        ),
        (VLLMValidationError("The decoder prompt cannot be empty"), None, "cannot be empty"),
        (wrapped(ValueError("Token id 99999 is out of vocabulary")), None, "out of vocabulary"),
        (wrapped(OverflowError("int too big to convert")), None, "out of range"),
        (ValueError("bad prompt"), None, "bad prompt"),
    ],
)
async def test_a_refusal_before_any_output_is_a_400(
    error: BaseException, param: str | None, says: str
) -> None:
    with pytest.raises(BadRequestError) as refused:
        await run(FailingLLM(error))
    assert (refused.value.status_code, refused.value.param) == (400, param)
    assert says in refused.value.message
    assert "parameter=" not in refused.value.message  # vLLM's own suffix is not repeated


async def test_after_output_it_is_not_the_requests_fault() -> None:
    with pytest.raises(ValueError):
        await run(FailingLLM(ValueError("late"), before=1))
    with pytest.raises(EngineGenerateError):
        await run(FailingLLM(wrapped(RuntimeError("engine bug"))))


async def test_a_dead_engine_is_a_503() -> None:
    with pytest.raises(EngineUnavailableError):
        await run(FailingLLM(EngineDeadError(), before=2))


# -- the isolation fix must be active on CPU ------------------------------------------------------

OURS = metadata.EntryPoint(
    name="lora_gateway", value="app.inside_vllm.plugin:register", group="vllm.general_plugins"
)
OTHER = metadata.EntryPoint(
    name="lora_filesystem_resolver", value="vllm.plugins:x", group="vllm.general_plugins"
)


def check(
    enabled: bool = True,
    *,
    is_cpu: bool = True,
    version: str = "0.32.0",
    plugins: list[metadata.EntryPoint] | None = None,
    environ: dict[str, str] | None = None,
) -> str:
    return require_isolation_fix(
        enabled,
        is_cpu=is_cpu,
        vllm_version=version,
        find_plugins=lambda: [OURS, OTHER] if plugins is None else plugins,
        environ=environ or {},
    )


def test_the_fix_is_active_when_installed_on_the_pinned_vllm() -> None:
    assert check() == "active"
    assert check(version="0.32.3+cpu") == "active"
    assert check(environ={"VLLM_PLUGINS": "lora_filesystem_resolver,lora_gateway"}) == "active"


def test_the_installed_entry_point_is_ours() -> None:
    # The real metadata of this checkout's installed distribution.
    assert vllm_plugin.PLUGIN_TARGET in [
        ep.value for ep in metadata.entry_points(group="vllm.general_plugins")
    ]
    assert require_isolation_fix(True, is_cpu=True, vllm_version="0.32.0") == "active"


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"plugins": [OTHER]}, "is not installed"),
        ({"plugins": []}, "is not installed"),
        (
            {"plugins": [metadata.EntryPoint("lora_gateway", "elsewhere:register", "g")]},
            "is not installed",
        ),
        ({"version": "0.33.0"}, "not 0.33.0"),
        ({"environ": {"VLLM_PLUGINS": "lora_filesystem_resolver"}}, "VLLM_PLUGINS"),
        ({"environ": {"VLLM_PLUGINS": ""}}, "VLLM_PLUGINS"),
    ],
)
def test_the_gateway_refuses_to_start_without_the_fix(options: dict[str, Any], says: str) -> None:
    with pytest.raises(IsolationFixUnavailable) as refused:
        check(**options)
    assert says in str(refused.value)
    assert "LORA_GATEWAY_ISOLATION_FIX=0" in str(refused.value)  # the way out, named


def test_turning_the_fix_off_is_the_one_override_and_it_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="lora_gateway.vllm_plugin"):
        assert check(False, plugins=[], version="0.99.0") == "disabled"
    assert "turned off" in caplog.text


def test_other_platforms_need_no_fix() -> None:
    assert check(is_cpu=False, plugins=[], version="0.99.0") == "not-cpu"
