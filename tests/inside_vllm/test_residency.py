"""The residency instrumentation on vLLM's own LRU code, without a model.

The LoRA managers here are vLLM's ``LRUCacheWorkerLoRAManager`` and
``LRUCacheLoRAModelManager`` with only what needs a model stubbed (building
and loading adapter weights), so that the tiers, evictions and swaps counted
come from vLLM's real cache logic. A tiny engine loop feeds them the way the
model runner does: one ``execute_model`` per step, naming the requests it
schedules for the first time, then ``set_active_adapters`` with the adapters
of every request in the batch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm.config.lora import LoRAConfig
from vllm.lora.lora_model import LoRAModel
from vllm.lora.model_manager import AdapterLRUCache, LRUCacheLoRAModelManager
from vllm.lora.request import LoRARequest
from vllm.lora.worker_manager import LRUCacheWorkerLoRAManager

from app.inside_vllm.residency import ResidencyTracker, instrument, split_engine_name
from app.metrics import CacheTier, SwapStage, Tier
from tests.support.lru_walkthrough import (
    ACTIVATIONS,
    EVICTIONS,
    LOADS,
    MAX_CPU_LORAS,
    MAX_LORAS,
    RESIDENT,
    USES,
    WALKTHROUGH,
)

STEPS_PER_REQUEST = 3  # a prefill and two decodes


@dataclass
class Recorded:
    """A :class:`app.inside_vllm.residency.Recorder` keeping everything."""

    uses: Counter[tuple[Tier, str, str]] = field(default_factory=Counter)
    swaps: dict[SwapStage, list[float]] = field(
        default_factory=lambda: {"load": [], "activate": []}
    )
    evictions: Counter[CacheTier] = field(default_factory=Counter)
    occupancy: dict[CacheTier, int] = field(default_factory=dict)
    starts: int = 0
    swapped: dict[SwapStage, list[str]] = field(
        default_factory=lambda: {"load": [], "activate": []}
    )
    tiers: dict[str, Tier] = field(default_factory=dict)

    def start(self) -> None:
        self.starts += 1

    def use(self, tier: Tier, adapter: str, version: str, count: int) -> None:
        self.uses[tier, adapter, version] += count

    def swap(self, stage: SwapStage, seconds: float, adapter: str, version: str) -> None:
        assert seconds >= 0
        self.swaps[stage].append(seconds)
        self.swapped[stage].append(adapter)

    def placed(self, adapter: str, version: str, tier: Tier) -> None:
        self.tiers[adapter] = tier

    def eviction(self, tier: CacheTier, count: int) -> None:
        self.evictions[tier] += count

    def resident(self, tier: CacheTier, count: int) -> None:
        self.occupancy[tier] = count


class Engine:
    """vLLM's worker side in miniature, instrumented afresh per instance."""

    def __init__(self, max_loras: int, max_cpu_loras: int) -> None:
        class ModelManager(LRUCacheLoRAModelManager):
            def __init__(self) -> None:  # no model: only the caches
                self.lora_config = LoRAConfig(max_loras=max_loras, max_cpu_loras=max_cpu_loras)
                self.device = torch.device("cpu")
                self.modules = {}
                self.lora_index_to_id = [None] * self.lora_slots
                # As vLLM's __init__ sets it: the isolation fix, once applied in this process
                # (any earlier test may have), reports activations to these wrappers.
                self.punica_wrapper_mapping = {}
                self._registered_adapters = AdapterLRUCache(self.capacity, self.deactivate_adapter)
                self._active_adapters = AdapterLRUCache(self.lora_slots, self._deactivate_adapter)

            def _add_adapter(self, lora: LoRAModel) -> None:
                self._registered_adapters[lora.id] = lora

            def create_dummy_lora(self, lora_id: int, rank: int, *_: Any, **__: Any) -> LoRAModel:
                return LoRAModel(lora_id, rank, {})

        class WorkerManager(LRUCacheWorkerLoRAManager):
            def __init__(self) -> None:
                self.broken: set[str] = set()
                self._cached_dummy_lora = False
                self.embedding_modules = {}

            def create_lora_manager(self, *_: Any) -> None:
                self._adapter_manager = ModelManager()

            def _load_adapter(self, lora_request: LoRARequest) -> LoRAModel:
                if lora_request.lora_name in self.broken:
                    raise FileNotFoundError(lora_request.lora_path)
                return LoRAModel(lora_request.lora_int_id, 8, {})

        engine = self

        class WorkerWrapper:
            def execute_model(self, scheduler_output: Any) -> None:
                engine.worker.set_active_adapters(scheduler_output.batch, None)

        self.recorded = Recorded()
        self.tracker = ResidencyTracker(self.recorded)
        instrument(
            self.tracker,
            worker_wrapper_cls=WorkerWrapper,
            worker_manager_cls=WorkerManager,
            model_manager_cls=ModelManager,
        )
        self.worker = WorkerManager()
        self.worker.create_lora_manager(None, None)
        self.wrapper = WorkerWrapper()
        self._ids: dict[str, int] = {}

    def lora(self, name: str) -> LoRARequest:
        lora_id = self._ids.setdefault(name, len(self._ids) + 1)
        return LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=f"/adapters/{name}")

    def step(self, new: Iterable[str | None], running: Iterable[str | None] = ()) -> None:
        """One step: ``new`` requests first scheduled, ``running`` ones continued."""
        new_reqs = [SimpleNamespace(lora_request=self.lora(n) if n else None) for n in new]
        batch = {self.lora(n) for n in [*new, *running] if n}
        self.wrapper.execute_model(SimpleNamespace(scheduled_new_reqs=new_reqs, batch=batch))

    def serve(self, sequence: Iterable[str | None]) -> None:
        """Requests one at a time, each for a few steps, as a sequential client sends them."""
        for name in sequence:
            self.step([name])
            for _ in range(STEPS_PER_REQUEST - 1):
                self.step([], [name])


NAMES = {"A": "a@v1", "B": "b@v2", "C": "c@v1"}


def test_split_engine_name() -> None:
    assert split_engine_name("legal_advisor@v1") == ("legal_advisor", "1")
    assert split_engine_name("a@v2@v13") == ("a@v2", "13")
    assert split_engine_name("plain") == ("plain", "")
    assert split_engine_name("odd@vx") == ("odd@vx", "")


def test_the_walkthrough_counts_each_request_at_its_tier() -> None:
    engine = Engine(max_loras=MAX_LORAS, max_cpu_loras=MAX_CPU_LORAS)
    assert engine.recorded.starts == 1
    engine.serve([NAMES[letter] if letter else None for letter, _ in WALKTHROUGH])

    recorded = engine.recorded
    assert recorded.uses == {
        (tier, *split_engine_name(NAMES[letter])): n for (letter, tier), n in USES.items()
    }
    assert len(recorded.swaps["load"]) == LOADS
    assert len(recorded.swaps["activate"]) == ACTIVATIONS
    assert recorded.evictions == EVICTIONS
    assert recorded.occupancy == RESIDENT
    assert not engine.tracker.pending
    # Per adapter: which one moved at each swap, and where each is at the end.
    assert recorded.swapped == {"load": list("abcba"), "activate": list("abacbca")}
    assert recorded.tiers == {"a": "device", "c": "host", "b": "storage"}


def test_requests_first_scheduled_together_are_each_a_use() -> None:
    engine = Engine(max_loras=2, max_cpu_loras=2)
    engine.step(["a@v1", "a@v1", "b@v1"])
    engine.step(["a@v1"], ["a@v1", "a@v1", "b@v1"])
    assert engine.recorded.uses == {
        ("storage", "a", "1"): 2,
        ("storage", "b", "1"): 1,
        ("device", "a", "1"): 1,
    }
    assert len(engine.recorded.swaps["load"]) == len(engine.recorded.swaps["activate"]) == 2
    assert not engine.recorded.evictions


def test_a_resumed_request_moves_its_adapter_but_is_not_a_new_use() -> None:
    engine = Engine(max_loras=1, max_cpu_loras=2)
    engine.step(["a@v1"])
    engine.step(["b@v1"])  # a preempted: b takes the slot
    engine.step([], ["a@v1"])  # a resumes: back from the host cache
    assert engine.recorded.uses == {("storage", "a", "1"): 1, ("storage", "b", "1"): 1}
    assert len(engine.recorded.swaps["activate"]) == 3
    assert engine.recorded.evictions == {"device": 2}


def test_warm_up_dummies_are_not_measured() -> None:
    engine = Engine(max_loras=2, max_cpu_loras=3)
    worker = engine.worker
    # As vLLM's maybe_setup_dummy_loras + maybe_select_dummy_loras do, with
    # the dummy ids (1, 2) that real adapters get too.
    dummies = {LoRARequest(f"warmup_{i}", i, "/not/a/real/path") for i in (1, 2)}
    with worker.dummy_lora_cache():
        for dummy in dummies:
            worker.add_dummy_lora(dummy, rank=8)
        engine.wrapper.execute_model(SimpleNamespace(scheduled_new_reqs=[], batch=dummies))
    worker.remove_all_adapters()  # type: ignore[no-untyped-call]
    assert engine.recorded.swaps == {"load": [], "activate": []}
    assert not engine.recorded.evictions
    assert engine.recorded.occupancy == {"device": 0, "host": 0}

    engine.serve(["a@v1"])  # lora id 1, like warmup_1
    assert engine.recorded.uses == {("storage", "a", "1"): 1}


def test_a_failed_load_is_neither_a_use_nor_a_swap() -> None:
    engine = Engine(max_loras=1, max_cpu_loras=2)
    engine.worker.broken = {"gone@v1"}
    with pytest.raises(FileNotFoundError):
        engine.step(["gone@v1"])
    assert not engine.tracker.pending
    engine.serve(["a@v1"])
    assert engine.recorded.uses == {("storage", "a", "1"): 1}
    assert len(engine.recorded.swaps["load"]) == 1


def test_an_explicit_removal_is_not_an_eviction() -> None:
    engine = Engine(max_loras=1, max_cpu_loras=2)
    engine.serve(["a@v1"])
    assert engine.recorded.occupancy == {"device": 1, "host": 1}
    engine.worker.remove_adapter(engine.lora("a@v1").lora_int_id)
    assert engine.recorded.occupancy == {"device": 0, "host": 0}
    assert not engine.recorded.evictions


def test_a_host_eviction_can_free_a_device_slot() -> None:
    engine = Engine(max_loras=1, max_cpu_loras=1)
    engine.serve(["a@v1", "b@v1"])
    assert engine.recorded.evictions == {"host": 1, "device": 1}
    assert len(engine.recorded.swaps["activate"]) == 2


def test_a_manager_without_the_expected_caches_turns_measuring_off() -> None:
    class WorkerManager(LRUCacheWorkerLoRAManager):
        def __init__(self) -> None:
            pass

        def create_lora_manager(self, *_: Any) -> None:
            # As if a vLLM upgrade had renamed the caches the tiers are read from.
            self._adapter_manager = SimpleNamespace(_registered_adapters={})  # type: ignore[assignment]

    class Wrapper:
        def execute_model(self, scheduler_output: Any) -> None: ...

    recorded = Recorded()
    tracker = ResidencyTracker(recorded)
    instrument(
        tracker,
        worker_wrapper_cls=Wrapper,
        worker_manager_cls=WorkerManager,
        model_manager_cls=type("ModelManager", (LRUCacheLoRAModelManager,), {}),
    )
    WorkerManager().create_lora_manager(None, None)
    assert tracker.silent and not tracker.enabled
    assert recorded.starts == 0 and not recorded.occupancy


def test_instrumenting_again_replaces_the_first_tracker() -> None:
    engine = Engine(max_loras=1, max_cpu_loras=2)
    first = engine.recorded
    second = Recorded()
    instrument(
        ResidencyTracker(second),
        worker_wrapper_cls=type(engine.wrapper),
        worker_manager_cls=type(engine.worker),
        model_manager_cls=type(engine.worker._adapter_manager),
    )
    engine.serve(["a@v1"])
    assert not first.uses
    assert second.uses == {("storage", "a", "1"): 1}
    assert len(second.swaps["activate"]) == 1


def test_instrumenting_is_all_or_nothing() -> None:
    class Wrapper:
        def execute_model(self, scheduler_output: Any) -> None: ...

    class Incomplete:
        pass

    original = Wrapper.execute_model
    with pytest.raises(AttributeError, match=r"Incomplete\.add_adapter"):
        instrument(
            ResidencyTracker(Recorded()),
            worker_wrapper_cls=Wrapper,
            worker_manager_cls=Incomplete,
            model_manager_cls=LRUCacheLoRAModelManager,
        )
    assert Wrapper.execute_model is original
