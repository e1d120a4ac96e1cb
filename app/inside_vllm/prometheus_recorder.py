"""Adapter residency measurements as the Prometheus metrics of :mod:`app.metrics`.

Runs in vLLM's worker process. In multiprocess mode (the gateway sets
``PROMETHEUS_MULTIPROC_DIR`` before the engine spawns it) the samples land in
files the gateway's ``GET /metrics`` merges; without it they stay in the
worker's memory, unexported and harmless.
"""

from __future__ import annotations

import atexit
import contextlib
import os

from prometheus_client import multiprocess

from app.metrics import (
    ADAPTER_EVICTIONS,
    ADAPTER_SWAP_SECONDS,
    ADAPTER_SWAP_TIME,
    ADAPTER_SWAPS,
    ADAPTER_TIER,
    ADAPTER_USES,
    ADAPTERS_RESIDENT,
    CACHE_TIERS,
    MULTIPROC_ENV,
    SWAP_STAGES,
    TIER_LEVEL,
    CacheTier,
    SwapStage,
    Tier,
)


def is_reporting_rank() -> bool:
    """Whether this worker speaks for its engine.

    Every tensor-parallel rank (and every pipeline stage) of one engine holds
    its own LoRA manager making the same moves; only the first reports, so
    that counters are not multiplied by the parallel degree. Engines of a
    data-parallel deployment each have a first rank: their counts add up.
    Outside an initialised vLLM worker (tests): True.
    """
    try:
        from vllm.distributed import parallel_state
    except ImportError:
        return True
    if not parallel_state.model_parallel_is_initialized():  # type: ignore[no-untyped-call]
        return True
    return bool(
        parallel_state.get_tensor_model_parallel_rank() == 0
        and parallel_state.get_pp_group().is_first_rank
    )


def _mark_dead(pid: int) -> None:
    # The gateway may have deleted the directory already: nothing to mark.
    with contextlib.suppress(OSError, TypeError):
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


class PrometheusRecorder:
    """A :class:`app.inside_vllm.residency.Recorder` writing to :mod:`app.metrics`.

    Silent on ranks that do not report (:func:`is_reporting_rank`, decided at
    the first event, when vLLM's parallel state is set up).
    """

    def __init__(self) -> None:
        self._reporting: bool | None = None

    def _enabled(self) -> bool:
        if self._reporting is None:
            self._reporting = is_reporting_rank()
        return self._reporting

    def start(self) -> None:
        if not self._enabled():
            return
        # Series that exist from the start read 0 rather than absent, so that
        # rate() and ratios work before the first eviction or swap.
        for tier in CACHE_TIERS:
            ADAPTER_EVICTIONS.labels(tier=tier)
            ADAPTERS_RESIDENT.labels(tier=tier).set(0)
        for stage in SWAP_STAGES:
            ADAPTER_SWAP_SECONDS.labels(stage=stage)
        if os.environ.get(MULTIPROC_ENV):
            # A 'livesum' gauge counts only processes not marked dead.
            atexit.register(_mark_dead, os.getpid())

    def use(self, tier: Tier, adapter: str, version: str, count: int) -> None:
        if self._enabled():
            ADAPTER_USES.labels(tier=tier, adapter=adapter, version=version).inc(count)

    def swap(self, stage: SwapStage, seconds: float, adapter: str, version: str) -> None:
        if self._enabled():
            ADAPTER_SWAP_SECONDS.labels(stage=stage).observe(seconds)
            ADAPTER_SWAPS.labels(stage=stage, adapter=adapter, version=version).inc()
            ADAPTER_SWAP_TIME.labels(stage=stage, adapter=adapter, version=version).inc(seconds)

    def placed(self, adapter: str, version: str, tier: Tier) -> None:
        if self._enabled():
            ADAPTER_TIER.labels(adapter=adapter, version=version).set(TIER_LEVEL[tier])

    def eviction(self, tier: CacheTier, count: int) -> None:
        if self._enabled():
            ADAPTER_EVICTIONS.labels(tier=tier).inc(count)

    def resident(self, tier: CacheTier, count: int) -> None:
        if self._enabled():
            ADAPTERS_RESIDENT.labels(tier=tier).set(count)
