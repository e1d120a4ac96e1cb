"""An adapter that fails to load fails the request that asked for it, never the engine.

vLLM loads a request's adapter inside the engine step that first schedules the request
(``WorkerLoRAManager._load_adapter``, reached from the model runner's ``execute_model``).
Whatever that load raises (a weights file corrupted on disk, a config ``PEFTHelper`` refuses)
comes out of the step, and vLLM's engine core treats every exception of a step as fatal: the
engine dies, and every tenant's requests with it. Catching the error inside the step would
not help: the step's batch is already formed around the adapter's slot, and the worker has
no way to drop one request from it.

So the load is moved in front of the step, where a failure can be one request's. The engine
core's :func:`add_request` (wrapped here) asks the worker, before the scheduler ever sees a
request, to load its adapter unless the worker's host cache holds it already
(:func:`check_load`, a ``collective_rpc``: the worker may live in another process). A load
that fails ends that request alone, at once, with vLLM's ``error`` finish and a
``stop_reason`` starting with :data:`LOAD_FAILED`, which the gateway reads
(:func:`load_failure`); the scheduler never sees it. A load that succeeds is kept, and the
step that schedules the request takes it instead of reading the files again
(:func:`_take_checked`), so an adapter is still read once. vLLM's own front end asks the
same question in one place only (its server's resolver path calls ``add_lora`` first); this
covers every request, in-process gateway and engine role alike.

Its cost: one ``collective_rpc`` round trip per request that names an adapter, on the
engine core's thread between steps (where vLLM's own input handling runs), plus the load
itself where one was due anyway. With vLLM's batch queue (async scheduling, pipeline
parallelism) a step may be in flight then, and the check waits for the worker to finish
it.

What it cannot cover: an adapter cached in the worker when its request arrived, evicted
from the host cache before the request is scheduled, whose files change meanwhile. Stored
versions are immutable and content-addressed, so that takes a disk going bad under a
running engine; the upload check (app/tenancy/validation.py) puts each config to vLLM's own
reader first, so a config vLLM refuses never gets this far.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import OrderedDict
from typing import Any

logger = logging.getLogger("lora_gateway.load_failures")

LOAD_FAILED = "lora_gateway:adapter_load_failed:"
"""How an ended request's ``stop_reason`` starts when its adapter failed to load; the reason
follows."""
KEPT_CHECKED = 16
"""Adapters loaded by :func:`check_load` and not yet taken by a step, at most (the oldest go:
its step then reads the files again, as vLLM would)."""

_checked: OrderedDict[int, Any] = OrderedDict()
_lock = threading.Lock()
_installed = False


def load_failure(stop_reason: object) -> str | None:
    """The reason an adapter failed to load, from an ended request's ``stop_reason``; ``None``
    when it ended otherwise."""
    if isinstance(stop_reason, str) and stop_reason.startswith(LOAD_FAILED):
        return stop_reason[len(LOAD_FAILED) :].strip()
    return None


def check_load(worker: Any, lora_request: Any) -> None:
    """In the worker: load ``lora_request``'s adapter unless its host cache holds it, and keep
    it for the step that schedules the request; raise what the load raises."""
    manager = getattr(getattr(worker, "model_runner", None), "lora_manager", None)
    if manager is None or lora_request.lora_int_id in manager.list_adapters():
        return
    lora = manager._load_adapter(lora_request)
    with _lock:
        _checked[lora_request.lora_int_id] = lora
        while len(_checked) > KEPT_CHECKED:
            _checked.popitem(last=False)


def _take_checked(lora_int_id: int) -> Any:
    with _lock:
        return _checked.pop(lora_int_id, None)


def _wrap_load_adapter(cls: type) -> None:
    original = cls._load_adapter  # type: ignore[attr-defined]

    @functools.wraps(original)
    def load_adapter(self: Any, lora_request: Any) -> Any:
        checked = None if lora_request.load_inplace else _take_checked(lora_request.lora_int_id)
        return checked if checked is not None else original(self, lora_request)

    cls._load_adapter = load_adapter  # type: ignore[attr-defined]


def _wrap_add_request(cls: type) -> None:
    original = cls.add_request  # type: ignore[attr-defined]

    @functools.wraps(original)
    def add_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        lora_request = getattr(request, "lora_request", None)
        outputs = getattr(self, "output_queue", None)
        if lora_request is None or outputs is None:
            return original(self, request, *args, **kwargs)
        try:
            self.model_executor.collective_rpc(check_load, args=(lora_request,))
        except Exception as exc:
            logger.warning(
                "adapter %s failed to load; request %s fails: %s",
                lora_request.lora_name,
                request.request_id,
                exc,
            )
            outputs.put_nowait((request.client_index, _failed(request.request_id, exc)))
            return None
        return original(self, request, *args, **kwargs)

    cls.add_request = add_request  # type: ignore[attr-defined]


def _failed(request_id: str, exc: Exception) -> Any:
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason

    ended = EngineCoreOutput(
        request_id,
        [],
        finish_reason=FinishReason.ERROR,
        stop_reason=f"{LOAD_FAILED} {exc}",
    )
    return EngineCoreOutputs(outputs=[ended], finished_requests={request_id})


def install() -> None:
    """Check adapters before their requests reach vLLM's scheduler; idempotent."""
    global _installed
    if _installed:
        return
    from vllm.lora.worker_manager import LRUCacheWorkerLoRAManager
    from vllm.v1.engine.core import EngineCoreProc

    # The class the model runner builds, over any wrapper of residency's (installed first).
    _wrap_load_adapter(LRUCacheWorkerLoRAManager)
    _wrap_add_request(EngineCoreProc)
    _installed = True
