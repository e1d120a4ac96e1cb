"""The :class:`~app.engine.base.Engine` implemented on vLLM's in-process AsyncLLM."""

from __future__ import annotations

import asyncio
import logging
import os
import platform
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import torch
import vllm
from vllm import AsyncEngineArgs, AsyncLLMEngine, RequestOutput, SamplingParams
from vllm.config import StructuredOutputsConfig, VllmConfig
from vllm.exceptions import VLLMValidationError
from vllm.inputs.engine import tokens_input
from vllm.lora.request import LoRARequest
from vllm.platforms import current_platform
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.engine.output_processor import RequestOutputCollector
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.stats import IterationStats, MultiModalCacheStats, SchedulerStats

from app import tracing
from app.engine.base import AdapterLoadFailed, EngineLoad
from app.errors import BadRequestError, EngineUnavailableError
from app.inside_vllm import slot_sharing
from app.inside_vllm.load_failures import load_failure
from app.inside_vllm.plugin import ENV_VAR as ISOLATION_FIX_ENV
from app.inside_vllm.plugin import require_isolation_fix
from app.settings import Dtype, Settings
from app.tenancy.adapters import Adapter

logger = logging.getLogger(__name__)

GIB = 1 << 30
X86 = ("x86_64", "AMD64")
# vLLM's CPU attention takes KV blocks of a multiple of 32 tokens only (an engine asked for 16
# fails to start): the smallest of them.
CPU_KV_BLOCK_SIZE = 32
VLLM_TRACES_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
VLLM_PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"


def engine_args(settings: Settings, otlp_traces_endpoint: str | None = None) -> AsyncEngineArgs:
    """vLLM's arguments for ``settings``; with ``otlp_traces_endpoint``, vLLM traces each
    request that comes with trace headers (app/tracing: under the gateway's span)."""
    return AsyncEngineArgs(
        model=settings.model,
        served_model_name=settings.base_model_id,
        dtype=engine_dtype(settings.dtype),
        max_model_len=settings.max_model_len,
        max_num_seqs=settings.max_num_seqs,
        stream_interval=settings.stream_interval,
        enable_lora=True,
        max_loras=settings.max_loras,
        max_cpu_loras=settings.max_cpu_loras,
        max_lora_rank=settings.max_lora_rank,
        block_size=engine_block_size(settings.kv_block_size),
        kv_cache_memory_bytes=(
            int(settings.kv_cache_gib * GIB) if settings.kv_cache_gib is not None else None
        ),
        gpu_memory_utilization=settings.gpu_memory_utilization,
        enforce_eager=settings.enforce_eager,
        seed=settings.seed,
        structured_outputs_config=structured_outputs_config(settings.structured_outputs_compact),
        otlp_traces_endpoint=otlp_traces_endpoint,
        **slot_sharing_options(settings),
    )


def slot_sharing_options(settings: Settings) -> dict[str, Any]:
    """The engine arguments of the slot turns ``settings`` ask for: by the quantum, and by the
    objectives requests carry. The scheduler that reads them always runs, even with no
    quantum and no class's objectives: an admin may give a tenant its own at any time."""
    return slot_sharing.engine_options(
        settings.lora_slot_quantum_tokens,
        keep_ending=settings.lora_slot_keep_ending,
        objectives=True,
    )


def engine_dtype(requested: Dtype) -> Dtype:
    """The dtype vLLM is asked for. ``auto`` takes the checkpoint's, bfloat16 for most models,
    which vLLM's CPU build runs even on an x86 CPU with no bfloat16 matmul (neither AVX-512
    BF16 nor AMX) by emulating it, several times slower than float32: there ``auto`` means
    float32 (docs/performance-log.md, "Scenario (c) in situ")."""
    if requested != "auto" or not current_platform.is_cpu() or platform.machine() not in X86:
        return requested
    if torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported():
        return requested
    logger.info("dtype auto: float32, this CPU has no bfloat16 matmul")
    return "float32"


def engine_block_size(requested: int | None) -> int | None:
    """The KV cache block size vLLM is asked for. Unset means vLLM's own on a GPU (16 tokens)
    and :data:`CPU_KV_BLOCK_SIZE` on a CPU, where vLLM's is 128: shorter requests than that
    each sit in a mostly empty block, and a request preempted for a slot turn is computed
    again from its last full block (docs/performance-log.md, "Slot turns at saturation")."""
    if requested is not None or not current_platform.is_cpu():
        return requested
    return CPU_KV_BLOCK_SIZE


def structured_outputs_config(compact: bool) -> StructuredOutputsConfig:
    """Compact JSON is an engine-wide option in vLLM (its backends ignore the per-request
    one), and only xgrammar and guidance take it, so "auto" (which may fall back to
    outlines) cannot. Guidance: its JSON Schema coverage is the wider, and it honours the
    option fully (xgrammar 0.2.8 still writes a space after commas)."""
    if not compact:
        return StructuredOutputsConfig(backend="auto")
    return StructuredOutputsConfig(backend="guidance", disable_any_whitespace=True)


def lora_request(adapter: Adapter) -> LoRARequest:
    return LoRARequest(
        lora_name=adapter.engine_name, lora_int_id=adapter.lora_id, lora_path=str(adapter.path)
    )


class LoadReports:
    """The engine core's latest scheduler report, per engine (one, or one per data-parallel
    rank). vLLM's front end hands every stat logger the report the engine core sends with each
    step's outputs, on the event loop; :meth:`logger` is the factory vLLM builds ours with."""

    def __init__(self) -> None:
        self._latest: dict[int, SchedulerStats] = {}
        self._reports = 0

    def logger(self, vllm_config: VllmConfig, engine_index: int = 0) -> StatLoggerBase:
        return _LoadLogger(self, engine_index)

    def record(self, engine_index: int, stats: SchedulerStats) -> None:
        self._latest[engine_index] = stats
        self._reports += 1

    def load(self) -> EngineLoad | None:
        if not self._latest:
            return None
        reports = self._latest.values()
        return EngineLoad(
            running=sum(r.num_running_reqs for r in reports),
            waiting=sum(r.num_waiting_reqs for r in reports),
            kv_cache_usage=max(r.kv_cache_usage for r in reports),
            step=self._reports,
        )


class _LoadLogger(StatLoggerBase):
    def __init__(self, reports: LoadReports, engine_index: int) -> None:
        self._reports = reports
        self._engine_index = engine_index

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        mm_cache_stats: MultiModalCacheStats | None = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is not None:
            self._reports.record(self._engine_index, scheduler_stats)

    def log_engine_initialized(self) -> None:
        return None


class VLLMEngine:
    def __init__(self, llm: AsyncLLMEngine, reports: LoadReports | None = None) -> None:
        self._llm = llm
        self._reports = reports or LoadReports()
        self.max_model_len: int = llm.model_config.max_model_len

    @property
    def tokenizer(self) -> Any:
        return self._llm.get_tokenizer()

    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        request_id: str,
        adapter: Adapter | None,
        cache_salt: str | None = None,
        on_abandoned: Callable[[RequestOutput], None] | None = None,
        trace_headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """The engine's outputs; its refusal of the request, before any output, is a
        :class:`BadRequestError` (400) naming the parameter where vLLM does; a dead engine is
        :class:`EngineUnavailableError` (503); an adapter that failed to load (the engine
        ended the request alone, :mod:`app.inside_vllm.load_failures`) is
        :class:`AdapterLoadFailed`.

        The request's output collector is read here, as ``AsyncLLM.generate`` reads it, not
        through that: cancelled, it aborts the request and drops the abort's last output,
        which carries the tokens a stream interval held back (vLLM's output processor hands
        them over only then). Here that output goes to ``on_abandoned``."""
        collector = await self._added(
            prompt_token_ids, params, request_id, adapter, cache_salt, trace_headers
        )
        finished = False
        try:
            while not finished:
                # Without a wait when an output is ready, as vLLM's own loop.
                output = collector.get_nowait() or await collector.get()
                assert isinstance(output, RequestOutput)
                finished = output.finished
                if finished and output.outputs:
                    reason = load_failure(output.outputs[0].stop_reason)
                    if reason is not None:
                        raise AdapterLoadFailed(reason)
                yield output
        except EngineDeadError as exc:
            raise EngineUnavailableError("The inference engine is not running.") from exc
        except BaseException:
            if not finished:
                await self._abandon(collector, on_abandoned)
            raise
        finally:
            collector.close()  # type: ignore[no-untyped-call]

    async def _added(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        request_id: str,
        adapter: Adapter | None,
        cache_salt: str | None,
        trace_headers: Mapping[str, str] | None = None,
    ) -> RequestOutputCollector:
        """The request, given to the engine; its output collector."""
        try:
            return await self._llm.add_request(
                request_id,
                tokens_input(list(prompt_token_ids), cache_salt=cache_salt),
                params,
                lora_request=lora_request(adapter) if adapter is not None else None,
                trace_headers=trace_headers,
            )
        except EngineDeadError as exc:
            raise EngineUnavailableError("The inference engine is not running.") from exc
        except (VLLMValidationError, ValueError, OverflowError) as exc:
            refusal = _request_refusal(exc)
            if refusal is None:
                raise
            # vLLM may have registered the request before refusing it (a seed the engine
            # core's transport cannot carry): it would count as unfinished for good.
            await self._llm.abort(request_id)
            raise refusal from exc

    async def _abandon(
        self,
        collector: RequestOutputCollector,
        on_abandoned: Callable[[RequestOutput], None] | None,
    ) -> None:
        """Abort a request whose stream stopped being read, and hand over its last output:
        vLLM's abort puts it in the collector at once, with the tokens held back, merged
        with any output not read yet."""
        try:
            await self._llm.abort(collector.request_id, internal=True)
        except Exception:
            logger.warning("could not abort request %s", collector.request_id, exc_info=True)
        try:
            last = collector.get_nowait()
        except Exception:  # the engine failed meanwhile: what failed reports it
            return
        if isinstance(last, RequestOutput) and on_abandoned is not None:
            on_abandoned(last)

    async def abort(self, request_id: str) -> None:
        await self._llm.abort(request_id)

    async def remove_adapter(self, adapter: Adapter) -> None:
        await self._llm.remove_lora(adapter.lora_id)

    async def check_health(self) -> None:
        try:
            await self._llm.check_health()
        except Exception as exc:
            raise EngineUnavailableError("The inference engine is not running.") from exc

    def num_unfinished_requests(self) -> int:
        return self._llm.get_num_unfinished_requests()

    def load(self) -> EngineLoad | None:
        return self._reports.load()


def _request_refusal(exc: BaseException) -> BadRequestError | None:
    """What vLLM's refusal of a request says, as a 400; ``None`` for a failure that is not
    about the request. ``ValueError`` is vLLM's "bad input" from its input processing (its
    OpenAI server answers 400 to it too), ``OverflowError`` a number too large to send to the
    engine core (a seed of 2**64)."""
    if isinstance(exc, VLLMValidationError):
        message = str(exc.args[0]) if exc.args else "The request was refused by the engine."
        return BadRequestError(message, param=exc.parameter)
    if isinstance(exc, OverflowError):
        return BadRequestError(f"A number in the request is out of range: {exc}")
    if isinstance(exc, ValueError):
        return BadRequestError(str(exc) or "The request was refused by the engine.")
    return None


@asynccontextmanager
async def start_vllm_engine(
    settings: Settings, *, otlp_traces_endpoint: str | None = None
) -> AsyncIterator[VLLMEngine]:
    """The running engine; shut down (child processes included) on exit. vLLM traces the
    requests the gateway traces where tracing is on (``OTEL_*``, app/tracing), or where
    ``otlp_traces_endpoint`` is given.

    Refuses to start (:class:`~app.inside_vllm.plugin.IsolationFixUnavailable`) on CPU when
    the isolation fix would not be active in the engine's processes."""
    isolation = require_isolation_fix(
        settings.isolation_fix, is_cpu=current_platform.is_cpu(), vllm_version=vllm.__version__
    )
    logger.info("CPU punica isolation fix: %s", isolation)
    # Our vLLM plugin runs inside the engine's child processes, which inherit
    # the environment at spawn: that is how this setting reaches it. Put back once
    # they have spawned: a process that starts another engine, or another
    # process, later decides afresh.
    previous = os.environ.get(ISOLATION_FIX_ENV)
    os.environ[ISOLATION_FIX_ENV] = "1" if settings.isolation_fix else "0"
    # vLLM's tracer writes its endpoint into the environment, for its processes' own tracers
    # (which export with the gateway's OTLP protocol, not vLLM's default of gRPC): put back
    # once they have spawned, so that it does not turn on tracing where the deployment did not
    # (app/tracing reads it).
    endpoint = otlp_traces_endpoint or tracing.traces_endpoint()
    kept = {name: os.environ.get(name) for name in (VLLM_TRACES_ENV, VLLM_PROTOCOL_ENV)}
    if endpoint is not None:
        os.environ[VLLM_PROTOCOL_ENV] = tracing.protocol()
    # Building the engine blocks for as long as the model loads: keep the
    # event loop free meanwhile, so /healthz answers while /readyz says 503.
    reports = LoadReports()
    try:
        llm = await asyncio.to_thread(
            AsyncLLMEngine.from_engine_args,
            engine_args(settings, endpoint),
            stat_loggers=[reports.logger],
        )
    finally:
        for name, value in ((ISOLATION_FIX_ENV, previous), *kept.items()):
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    try:
        yield VLLMEngine(llm, reports)
    finally:
        llm.shutdown()
