"""Adapter residency metrics, measured where adapters move: in vLLM's worker.

vLLM keeps LoRA adapters in three tiers (a device slot, the host cache, storage) and moves
them in its worker's LRU managers. :func:`install` wraps those methods (the plugin calls it in
every vLLM process; only the worker calls them) to count each request's *use* of an adapter
once, at the tier it was found in, to time each ``load`` and ``activate``, and to count
evictions. What one use is, and which vLLM method each wrapper watches, is in
docs/metrics.md. Like vLLM's LRU code, the wrappers rely on the engine loop being
single-threaded: they hold no lock.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from app.metrics import CacheTier, SwapStage, Tier

logger = logging.getLogger("lora_gateway.residency")

_ENGINE_NAME = re.compile(r"^(?P<adapter>.+)@v(?P<version>\d+)$")
_WRAPPED = "__lora_gateway_residency__"


def split_engine_name(name: str) -> tuple[str, str]:
    """``(adapter, version)`` of an engine LoRA name: ``"legal@v3"`` gives
    ``("legal", "3")``; a name without an ``@v<digits>`` suffix gives
    ``(name, "")``."""
    match = _ENGINE_NAME.match(name)
    if match is None:
        return name, ""
    return match["adapter"], match["version"]


class Recorder(Protocol):
    """Where the measurements go; one call per event."""

    def start(self) -> None:
        """The LoRA manager exists: publish zero-valued series."""

    def use(self, tier: Tier, adapter: str, version: str, count: int) -> None: ...

    def swap(self, stage: SwapStage, seconds: float, adapter: str, version: str) -> None: ...

    def placed(self, adapter: str, version: str, tier: Tier) -> None:
        """Where one adapter version is now (``storage``: in neither cache)."""

    def eviction(self, tier: CacheTier, count: int) -> None: ...

    def resident(self, tier: CacheTier, count: int) -> None: ...


@dataclass
class ResidencyTracker:
    """The per-process state between the wrapped vLLM calls."""

    recorder: Recorder
    # (lora_int_id, lora_name) -> requests first scheduled in the running
    # step and not yet counted; the name keeps vLLM's warm-up dummies
    # ("warmup_<id>", ids from 1) apart from real adapters with equal ids.
    pending: Counter[tuple[int, str]] = field(default_factory=Counter)
    # Depth of vLLM's dummy-LoRA warm-up: its adapter moves are not traffic.
    warmups: int = 0
    # False once the LoRA manager turned out not to have the caches we read.
    enabled: bool = True
    _resident: dict[CacheTier, int] = field(default_factory=dict)
    # lora_int_id -> (adapter, version) of every adapter seen, and its tier.
    names: dict[int, tuple[str, str]] = field(default_factory=dict)
    _placement: dict[int, Tier] = field(default_factory=dict)

    @property
    def silent(self) -> bool:
        """Whether vLLM's calls now go unmeasured (off, or warming up)."""
        return not self.enabled or self.warmups > 0

    def expect(self, lora_requests: Iterable[Any]) -> None:
        """Note the adapters of the requests first scheduled in the step about
        to run (``None``: the base model), replacing what the last step left.

        Every step that runs the model applies its adapters within itself, so
        a leftover can only come from a step that ran no model; dropping it
        keeps a later step from counting it at the wrong tier, and the state
        bounded.
        """
        self.pending = Counter(
            (request.lora_int_id, request.lora_name)
            for request in lora_requests
            if request is not None
        )

    def take(self, lora_request: Any) -> int:
        """Requests waiting for ``lora_request``'s adapter; forgets them."""
        return self.pending.pop((lora_request.lora_int_id, lora_request.lora_name), 0)

    def refresh(self, model_manager: Any) -> None:
        """Publish the tiers' occupancy if it changed."""
        occupancy: tuple[tuple[CacheTier, int], ...] = (
            ("device", len(model_manager._active_adapters)),
            ("host", len(model_manager._registered_adapters)),
        )
        for tier, count in occupancy:
            if self._resident.get(tier) != count:
                self._resident[tier] = count
                self.recorder.resident(tier, count)
        for lora_id, (adapter, version) in self.names.items():
            placement: Tier = (
                "device"
                if lora_id in model_manager._active_adapters
                else "host"
                if lora_id in model_manager._registered_adapters
                else "storage"
            )
            if self._placement.get(lora_id) != placement:
                self._placement[lora_id] = placement
                self.recorder.placed(adapter, version, placement)

    def name_of(self, lora_id: int) -> tuple[str, str]:
        return self.names.get(lora_id, ("", ""))


def tier_of(model_manager: Any, lora_request: Any) -> Tier:
    """The tier ``lora_request``'s adapter is served from, were it applied now."""
    lora_id = lora_request.lora_int_id
    if lora_request.load_inplace or lora_id not in model_manager._registered_adapters:
        return "storage"
    if lora_id in model_manager._active_adapters:
        return "device"
    return "host"


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work (copies are asynchronous on GPUs)."""
    if device.type == "cpu":
        return
    backend = getattr(torch, device.type, None)
    sync = getattr(backend, "synchronize", None)
    if callable(sync):
        sync(device)


# -- the wrappers --------------------------------------------------------------


def _original(cls: type, name: str) -> Callable[..., Any]:
    """``cls.name`` as vLLM defines it, under any wrapper of ours."""
    method: Callable[..., Any] = getattr(cls, name)
    return getattr(method, _WRAPPED, method)


def _set(cls: type, name: str, original: Callable[..., Any], wrapper: Callable[..., Any]) -> None:
    functools.update_wrapper(wrapper, original)
    setattr(wrapper, _WRAPPED, original)
    setattr(cls, name, wrapper)


def _wrap_execute_model(tracker: ResidencyTracker, cls: type) -> None:
    original = _original(cls, "execute_model")

    def execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        new_requests = getattr(scheduler_output, "scheduled_new_reqs", None) or ()
        tracker.expect(request.lora_request for request in new_requests)
        return original(self, scheduler_output, *args, **kwargs)

    _set(cls, "execute_model", original, execute_model)


WORKER_MANAGER_HOOKS = (
    "add_adapter",
    "_load_adapter",
    "remove_adapter",
    "remove_all_adapters",
    "dummy_lora_cache",
    "create_lora_manager",
)
MODEL_MANAGER_HOOKS = ("activate_adapter", "remove_oldest_adapter")
# The model manager's LRU caches (instance attributes) the tiers are read from.
CACHES = ("_active_adapters", "_registered_adapters")


def _wrap_worker_manager(tracker: ResidencyTracker, cls: type) -> None:
    add_adapter = _original(cls, "add_adapter")
    load_adapter = _original(cls, "_load_adapter")
    remove_adapter = _original(cls, "remove_adapter")
    remove_all_adapters = _original(cls, "remove_all_adapters")
    dummy_lora_cache = _original(cls, "dummy_lora_cache")
    create_lora_manager = _original(cls, "create_lora_manager")

    def add(self: Any, lora_request: Any) -> Any:
        if tracker.silent:
            return add_adapter(self, lora_request)
        uses = tracker.take(lora_request)
        tracker.names[lora_request.lora_int_id] = split_engine_name(lora_request.lora_name)
        tier = tier_of(self._adapter_manager, lora_request)
        result = add_adapter(self, lora_request)
        if uses:
            adapter, version = split_engine_name(lora_request.lora_name)
            tracker.recorder.use(tier, adapter, version, uses)
        tracker.refresh(self._adapter_manager)
        return result

    def load(self: Any, lora_request: Any) -> Any:
        # Storage -> host memory: vLLM loads to the CPU, nothing to synchronise.
        start = time.perf_counter()
        lora = load_adapter(self, lora_request)
        if not tracker.silent:
            adapter, version = split_engine_name(lora_request.lora_name)
            tracker.recorder.swap("load", time.perf_counter() - start, adapter, version)
        return lora

    def remove(self: Any, adapter_id: int) -> Any:
        # An explicit removal (a retired adapter version): not an eviction.
        result = remove_adapter(self, adapter_id)
        if not tracker.silent:
            tracker.refresh(self._adapter_manager)
        return result

    def remove_all(self: Any) -> Any:
        result = remove_all_adapters(self)
        if not tracker.silent:
            tracker.refresh(self._adapter_manager)
        return result

    @contextmanager
    def warm_up(self: Any) -> Iterator[None]:
        tracker.warmups += 1
        try:
            cache: AbstractContextManager[None] = dummy_lora_cache(self)
            with cache:
                yield
        finally:
            tracker.warmups -= 1

    def create(self: Any, *args: Any, **kwargs: Any) -> Any:
        model = create_lora_manager(self, *args, **kwargs)
        manager = self._adapter_manager
        missing = [name for name in CACHES if not hasattr(manager, name)]
        if missing:
            # A vLLM whose manager keeps its caches elsewhere: serve unmeasured
            # rather than fail inside the engine's step.
            tracker.enabled = False
            logger.warning(
                "adapter residency metrics off: %s has no %s",
                type(manager).__qualname__,
                ", ".join(missing),
            )
            return model
        tracker.recorder.start()
        tracker.refresh(manager)
        return model

    _set(cls, "add_adapter", add_adapter, add)
    _set(cls, "_load_adapter", load_adapter, load)
    _set(cls, "remove_adapter", remove_adapter, remove)
    _set(cls, "remove_all_adapters", remove_all_adapters, remove_all)
    _set(cls, "dummy_lora_cache", dummy_lora_cache, warm_up)
    _set(cls, "create_lora_manager", create_lora_manager, create)


def _wrap_model_manager(tracker: ResidencyTracker, cls: type) -> None:
    activate_adapter = _original(cls, "activate_adapter")
    remove_oldest_adapter = _original(cls, "remove_oldest_adapter")

    def activate(self: Any, lora_id: int) -> Any:
        if tracker.silent or lora_id in self._active_adapters:
            return activate_adapter(self, lora_id)
        before = set(self._active_adapters)
        start = time.perf_counter()
        result = activate_adapter(self, lora_id)
        synchronize(self.device)
        tracker.recorder.swap("activate", time.perf_counter() - start, *tracker.name_of(lora_id))
        evicted = len(before - set(self._active_adapters))
        if evicted:
            tracker.recorder.eviction("device", evicted)
        return result

    def remove_oldest(self: Any) -> Any:
        if tracker.silent:
            return remove_oldest_adapter(self)
        host, device = set(self._registered_adapters), set(self._active_adapters)
        result = remove_oldest_adapter(self)
        # Evicting a host copy frees the adapter's device slot too (vLLM's
        # LRU order leaves the host's oldest adapter in a slot only when
        # max_cpu_loras == max_loras).
        caches: tuple[tuple[CacheTier, set[int], Any], ...] = (
            ("host", host, self._registered_adapters),
            ("device", device, self._active_adapters),
        )
        for tier, before, cache in caches:
            evicted = len(before - set(cache))
            if evicted:
                tracker.recorder.eviction(tier, evicted)
        return result

    _set(cls, "activate_adapter", activate_adapter, activate)
    _set(cls, "remove_oldest_adapter", remove_oldest_adapter, remove_oldest)


def instrument(
    tracker: ResidencyTracker,
    *,
    worker_wrapper_cls: type,
    worker_manager_cls: type,
    model_manager_cls: type,
) -> None:
    """Wrap the classes' methods to report to ``tracker`` (replacing any
    earlier wrapping of ours on the same classes); all or none: raises
    ``AttributeError`` naming what is missing before wrapping anything."""
    missing = [
        f"{cls.__qualname__}.{name}"
        for cls, names in (
            (worker_wrapper_cls, ("execute_model",)),
            (worker_manager_cls, WORKER_MANAGER_HOOKS),
            (model_manager_cls, MODEL_MANAGER_HOOKS),
        )
        for name in names
        if not callable(getattr(cls, name, None))
    ]
    if missing:
        raise AttributeError(f"vLLM lacks {', '.join(missing)}")
    _wrap_execute_model(tracker, worker_wrapper_cls)
    _wrap_worker_manager(tracker, worker_manager_cls)
    _wrap_model_manager(tracker, model_manager_cls)


_tracker: ResidencyTracker | None = None


def install() -> None:
    """Instrument vLLM's classes in this process, once; never raises.

    A failure (a vLLM without these methods) leaves vLLM as shipped and is
    logged: the engine must serve even if it cannot be measured.
    """
    global _tracker
    if _tracker is not None:
        return
    try:
        from vllm.lora.model_manager import LRUCacheLoRAModelManager
        from vllm.lora.worker_manager import LRUCacheWorkerLoRAManager
        from vllm.v1.worker.worker_base import WorkerWrapperBase

        from app.inside_vllm.prometheus_recorder import PrometheusRecorder

        tracker = ResidencyTracker(PrometheusRecorder())
        instrument(
            tracker,
            worker_wrapper_cls=WorkerWrapperBase,
            worker_manager_cls=LRUCacheWorkerLoRAManager,
            model_manager_cls=LRUCacheLoRAModelManager,
        )
    except Exception:
        logger.warning("adapter residency metrics unavailable", exc_info=True)
        return
    _tracker = tracker
    logger.debug("adapter residency metrics installed")
