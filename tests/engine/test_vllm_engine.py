"""What vLLM raises about a request becomes a 400 before any output, and a dead engine a 503
(``VLLMEngine.generate`` over a stand-in for vLLM's AsyncLLM: the mapping, not the engine);
the dtype the engine is asked for."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

from app.engine import vllm_engine
from app.engine.vllm_engine import VLLMEngine
from app.errors import BadRequestError, EngineUnavailableError
from app.settings import Settings


class FailingLLM:
    """Yields ``before`` outputs, then raises ``error``."""

    def __init__(self, error: BaseException, before: int = 0) -> None:
        self.model_config = SimpleNamespace(max_model_len=64)
        self.error = error
        self.before = before
        self.aborted: list[str] = []

    async def generate(self, *_: Any, **__: Any) -> AsyncIterator[Any]:
        for _n in range(self.before):
            yield SimpleNamespace(finished=False, outputs=[])
        raise self.error

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def check_health(self) -> None:
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
    llm = FailingLLM(error)
    with pytest.raises(BadRequestError) as refused:
        await run(llm)
    assert (refused.value.status_code, refused.value.param) == (400, param)
    assert llm.aborted == ["r"]  # whatever vLLM registered of it is forgotten
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
    # The readiness probe's question, to the same dead engine.
    with pytest.raises(EngineUnavailableError, match="not running"):
        await VLLMEngine(FailingLLM(EngineDeadError())).check_health()  # type: ignore[arg-type]


BF16_CHECKS = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")


@pytest.mark.parametrize(
    ("requested", "machine", "native_bf16", "asked"),
    [
        ("auto", "x86_64", False, "float32"),  # emulated bfloat16: float32 instead
        ("auto", "x86_64", True, "auto"),  # the checkpoint's bfloat16, natively
        ("auto", "aarch64", False, "auto"),  # not ours to judge there
        ("bfloat16", "x86_64", False, "bfloat16"),  # asked for: given
    ],
)
def test_auto_dtype_is_float32_on_a_cpu_without_bfloat16_matmul(
    monkeypatch: pytest.MonkeyPatch, requested: str, machine: str, native_bf16: bool, asked: str
) -> None:
    monkeypatch.setattr(vllm_engine.current_platform, "is_cpu", lambda: True)
    monkeypatch.setattr(vllm_engine.platform, "machine", lambda: machine)
    for check in BF16_CHECKS:
        monkeypatch.setattr(vllm_engine.torch.cpu, check, lambda: native_bf16)
    assert vllm_engine.engine_dtype(requested) == asked
    assert vllm_engine.engine_args(Settings(_env_file=None, dtype=requested)).dtype == asked


@pytest.mark.parametrize(
    ("requested", "on_cpu", "asked"),
    [(None, True, vllm_engine.CPU_KV_BLOCK_SIZE), (None, False, None), (64, True, 64)],
)
def test_an_unset_kv_block_size_is_ours_on_a_cpu_and_vllms_elsewhere(
    monkeypatch: pytest.MonkeyPatch, requested: int | None, on_cpu: bool, asked: int | None
) -> None:
    monkeypatch.setattr(vllm_engine.current_platform, "is_cpu", lambda: on_cpu)
    settings = Settings(_env_file=None, kv_block_size=requested)  # type: ignore[call-arg]
    assert vllm_engine.engine_args(settings).block_size == asked


def test_auto_dtype_is_left_to_vllm_off_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_engine.current_platform, "is_cpu", lambda: False)
    assert vllm_engine.engine_dtype("auto") == "auto"
