"""What vLLM raises about a request becomes a 400 before any output, and a dead engine a 503;
a request whose stream stops being read is aborted, and its last output handed over
(``VLLMEngine.generate`` over stand-ins for vLLM's AsyncLLM: the mapping, not the engine);
the dtype the engine is asked for."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from vllm import CompletionOutput, RequestOutput, SamplingParams
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.engine.output_processor import RequestOutputCollector

from app.engine import vllm_engine
from app.engine.vllm_engine import VLLMEngine
from app.errors import BadRequestError, EngineUnavailableError
from app.settings import Settings


def request_output(tokens: list[int], finish_reason: str | None = None) -> RequestOutput:
    choice = CompletionOutput(
        index=0,
        text="x" * len(tokens),
        token_ids=tokens,
        cumulative_logprob=None,
        logprobs=None,
        finish_reason=finish_reason,
    )
    return RequestOutput("r", None, [1, 2], None, [choice], finished=finish_reason is not None)


class ScriptedCollector:
    """The output collector vLLM hands over for a request, reduced to what is read of it:
    ``items`` one at a time; an exception among them is raised, as vLLM's collector raises
    one its output handler put there."""

    def __init__(self, request_id: str, items: list[RequestOutput | BaseException]) -> None:
        self.request_id = request_id
        self.items = items

    def get_nowait(self) -> None:
        return None

    async def get(self) -> RequestOutput:
        item = self.items.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        pass


class FailingLLM:
    """Refuses a request with ``error`` as it is added; or, given ``before``, takes it and
    hands over ``before`` outputs, then fails it with ``error``."""

    def __init__(self, error: BaseException, before: int | None = None) -> None:
        self.model_config = SimpleNamespace(max_model_len=64)
        self.error = error
        self.before = before
        self.aborted: list[str] = []

    async def add_request(self, request_id: str, *_: Any, **__: Any) -> ScriptedCollector:
        if self.before is None:
            raise self.error
        outputs: list[RequestOutput | BaseException] = [
            request_output([n]) for n in range(self.before)
        ]
        return ScriptedCollector(request_id, [*outputs, self.error])

    async def abort(self, request_id: str, internal: bool = False) -> None:
        self.aborted.append(request_id)

    async def check_health(self) -> None:
        raise self.error


async def run(llm: FailingLLM) -> list[Any]:
    engine = VLLMEngine(llm)  # type: ignore[arg-type]
    return [o async for o in engine.generate([1, 2], SamplingParams(), "r", None)]


@pytest.mark.parametrize(
    ("error", "param", "says"),
    [
        (
            VLLMValidationError("top_p must be in (0, 1], got 2.", parameter="top_p"),
            "top_p",
            "top_p",
        ),
        (VLLMValidationError("The decoder prompt cannot be empty"), None, "cannot be empty"),
        (ValueError("Token id 99999 is out of vocabulary"), None, "out of vocabulary"),
        (OverflowError("int too big to convert"), None, "out of range"),
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
    late = FailingLLM(ValueError("late"), before=1)
    with pytest.raises(ValueError):
        await run(late)
    assert late.aborted == ["r"]
    with pytest.raises(RuntimeError):
        await run(FailingLLM(RuntimeError("engine bug")))


async def test_a_dead_engine_is_a_503() -> None:
    dead = FailingLLM(EngineDeadError(), before=2)
    with pytest.raises(EngineUnavailableError):
        await run(dead)
    assert dead.aborted == []  # nothing left to abort
    with pytest.raises(EngineUnavailableError):
        await run(FailingLLM(EngineDeadError()))
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


class HoldingLLM:
    """Stands in for AsyncLLM as vLLM's server reads it: ``add_request`` registers the
    request (under an internal id of vLLM's) and returns its output collector (vLLM's own),
    where the first token is at once; the next ``held`` tokens are held back for a chunk of
    ``stream_interval``, until ``abort`` hands them over in the request's last output, as
    vLLM's output processor does."""

    def __init__(self, held: int) -> None:
        self.model_config = SimpleNamespace(max_model_len=64)
        self.held = held
        self.collectors: dict[str, RequestOutputCollector] = {}
        self.aborted: list[tuple[str, bool]] = []

    async def add_request(
        self, request_id: str, prompt: Any, params: SamplingParams, **_: Any
    ) -> RequestOutputCollector:
        collector = RequestOutputCollector(params.output_kind, f"{request_id}-internal")
        collector.put(request_output([7]))
        self.collectors[collector.request_id] = collector
        return collector

    async def abort(self, request_id: str, internal: bool = False) -> None:
        self.aborted.append((request_id, internal))
        collector = self.collectors.pop(request_id if internal else f"{request_id}-internal")
        collector.put(request_output(list(range(self.held)), finish_reason="abort"))


CHUNKED = SamplingParams(stream_interval=1000, output_kind=RequestOutputKind.DELTA)


async def test_a_read_cancelled_mid_request_aborts_it_and_hands_over_what_it_held() -> None:
    llm = HoldingLLM(held=5)
    abandoned: list[RequestOutput] = []
    engine = VLLMEngine(llm)  # type: ignore[arg-type]
    outputs = engine.generate([1, 2], CHUNKED, "r", None, on_abandoned=abandoned.append)
    assert (await anext(outputs)).outputs[0].token_ids == [7]
    waiting = asyncio.ensure_future(anext(outputs))
    await asyncio.sleep(0)  # the read waits for the next output
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert llm.aborted == [("r-internal", True)]
    [last] = abandoned
    assert last.finished and last.outputs[0].token_ids == [0, 1, 2, 3, 4]


async def test_a_stream_closed_between_outputs_hands_over_what_it_held() -> None:
    llm = HoldingLLM(held=3)
    abandoned: list[RequestOutput] = []
    engine = VLLMEngine(llm)  # type: ignore[arg-type]
    outputs = engine.generate([1, 2], CHUNKED, "r", None, on_abandoned=abandoned.append)
    await anext(outputs)
    await outputs.aclose()  # type: ignore[attr-defined]
    assert llm.aborted == [("r-internal", True)]
    [last] = abandoned
    assert last.outputs[0].token_ids == [0, 1, 2]


async def test_an_abort_while_the_stream_is_read_ends_the_stream_with_what_it_held() -> None:
    llm = HoldingLLM(held=4)
    abandoned: list[RequestOutput] = []
    engine = VLLMEngine(llm)  # type: ignore[arg-type]
    outputs = engine.generate([1, 2], CHUNKED, "r", None, on_abandoned=abandoned.append)
    await anext(outputs)
    await engine.abort("r")
    rest = [output async for output in outputs]
    assert [o.outputs[0].token_ids for o in rest] == [[0, 1, 2, 3]] and rest[0].finished
    assert llm.aborted == [("r", False)] and abandoned == []
