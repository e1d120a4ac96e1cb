"""The adapter load check in front of vLLM's scheduler (app/inside_vllm/load_failures.py), on
stand-ins for the engine core and the worker: a failed load ends that request alone with an
error finish naming the cause, and the scheduler never sees it; a good load is read once."""

from __future__ import annotations

import queue
from types import SimpleNamespace
from typing import Any

import pytest
from vllm.lora.request import LoRARequest
from vllm.v1.engine import FinishReason

from app.inside_vllm import load_failures


class Manager:
    """The worker's LoRA manager: a host cache, and a load that reads the disk."""

    def __init__(self, broken: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        self.cached: set[int] = set()
        self.broken = broken
        self.reads: list[int] = []

    def list_adapters(self) -> set[int]:
        return self.cached

    def _load_adapter(self, lora_request: LoRARequest) -> Any:
        self.reads.append(lora_request.lora_int_id)
        if lora_request.lora_int_id in self.broken:
            raise ValueError("Error while deserializing header: header too large")
        return f"weights of {lora_request.lora_int_id}"


class Executor:
    """``collective_rpc`` as vLLM's executors run a callable: on each worker, raising what
    the worker raised."""

    def __init__(self, manager: Manager) -> None:
        self.worker = SimpleNamespace(model_runner=SimpleNamespace(lora_manager=manager))

    def collective_rpc(self, method: Any, args: tuple[Any, ...] = ()) -> list[Any]:
        return [method(self.worker, *args)]


class EngineCore:
    def __init__(self, manager: Manager) -> None:
        self.model_executor = Executor(manager)
        self.output_queue: queue.Queue[Any] = queue.Queue()
        self.scheduled: list[str] = []

    def add_request(self, request: Any, request_wave: int = 0) -> None:
        self.scheduled.append(request.request_id)


def request(request_id: str, lora_int_id: int | None) -> Any:
    lora = (
        None
        if lora_int_id is None
        else LoRARequest(f"a@v{lora_int_id}", lora_int_id, f"/store/{lora_int_id}")
    )
    return SimpleNamespace(request_id=request_id, lora_request=lora, client_index=0)


@pytest.fixture
def wrapped(monkeypatch: pytest.MonkeyPatch) -> type[EngineCore]:
    monkeypatch.setattr(load_failures, "_checked", type(load_failures._checked)())
    core = type("WrappedCore", (EngineCore,), {})
    load_failures._wrap_add_request(core)
    return core


def test_a_failed_load_ends_that_request_alone_and_the_scheduler_never_sees_it(
    wrapped: type[EngineCore],
) -> None:
    core = wrapped(Manager(broken={2}))
    core.add_request(request("good", 1))
    core.add_request(request("broken", 2))
    core.add_request(request("base", None))

    assert core.scheduled == ["good", "base"]
    client, outputs = core.output_queue.get_nowait()
    assert core.output_queue.empty()
    assert client == 0 and outputs.finished_requests == {"broken"}
    (ended,) = outputs.outputs
    assert ended.request_id == "broken" and ended.finish_reason == FinishReason.ERROR
    assert load_failures.load_failure(ended.stop_reason) == (
        "Error while deserializing header: header too large"
    )


def test_a_checked_load_is_what_the_step_gets_and_a_cached_adapter_is_not_read(
    wrapped: type[EngineCore],
) -> None:
    manager = Manager()
    manager.cached = {3}
    core = wrapped(manager)
    core.add_request(request("cold", 1))
    core.add_request(request("warm", 3))
    assert manager.reads == [1]  # the cached adapter is not read again

    step_manager = type("StepManager", (Manager,), {})
    load_failures._wrap_load_adapter(step_manager)
    step = step_manager()
    assert step._load_adapter(request("cold", 1).lora_request) == "weights of 1"
    assert step.reads == []  # the step took the checked load, not the disk
    assert step._load_adapter(request("again", 1).lora_request) == "weights of 1"
    assert step.reads == [1]  # taken once: a later load reads the disk, as vLLM would


def test_only_an_adapter_load_failure_is_one() -> None:
    assert load_failures.load_failure(None) is None
    assert load_failures.load_failure("</s>") is None
    assert load_failures.load_failure(7) is None
    assert load_failures.load_failure(f"{load_failures.LOAD_FAILED} bad file") == "bad file"
