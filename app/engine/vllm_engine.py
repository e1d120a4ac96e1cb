"""The :class:`~app.engine.base.Engine` implemented on vLLM's in-process AsyncLLM."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from vllm import AsyncEngineArgs, AsyncLLMEngine, RequestOutput, SamplingParams
from vllm.inputs.engine import tokens_input
from vllm.lora.request import LoRARequest
from vllm.v1.engine.exceptions import EngineDeadError

from app.engine.vllm_plugin import ENV_VAR as ISOLATION_FIX_ENV
from app.errors import EngineUnavailableError
from app.settings import Settings
from app.tenancy.adapters import Adapter

logger = logging.getLogger(__name__)

GIB = 1 << 30


def engine_args(settings: Settings) -> AsyncEngineArgs:
    return AsyncEngineArgs(
        model=settings.model,
        served_model_name=settings.base_model_id,
        dtype=settings.dtype,
        max_model_len=settings.max_model_len,
        max_num_seqs=settings.max_num_seqs,
        enable_lora=True,
        max_loras=settings.max_loras,
        max_cpu_loras=settings.max_cpu_loras,
        max_lora_rank=settings.max_lora_rank,
        kv_cache_memory_bytes=(
            int(settings.kv_cache_gib * GIB) if settings.kv_cache_gib is not None else None
        ),
        gpu_memory_utilization=settings.gpu_memory_utilization,
        enforce_eager=settings.enforce_eager,
        seed=settings.seed,
    )


def lora_request(adapter: Adapter) -> LoRARequest:
    return LoRARequest(
        lora_name=adapter.engine_name, lora_int_id=adapter.lora_id, lora_path=str(adapter.path)
    )


class VLLMEngine:
    def __init__(self, llm: AsyncLLMEngine) -> None:
        self._llm = llm
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
    ) -> AsyncIterator[RequestOutput]:
        try:
            async for output in self._llm.generate(
                tokens_input(list(prompt_token_ids), cache_salt=cache_salt),
                params,
                request_id,
                lora_request=lora_request(adapter) if adapter is not None else None,
            ):
                yield output
        except EngineDeadError as exc:
            raise EngineUnavailableError("The inference engine is not running.") from exc

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


@asynccontextmanager
async def start_vllm_engine(settings: Settings) -> AsyncIterator[VLLMEngine]:
    """The running engine; shut down (child processes included) on exit."""
    # Our vLLM plugin runs inside the engine's child processes, which inherit
    # the environment at spawn: that is how this setting reaches it.
    os.environ[ISOLATION_FIX_ENV] = "1" if settings.isolation_fix else "0"
    # Building the engine blocks for as long as the model loads: keep the
    # event loop free meanwhile, so /healthz answers while /readyz says 503.
    llm = await asyncio.to_thread(AsyncLLMEngine.from_engine_args, engine_args(settings))
    try:
        yield VLLMEngine(llm)
    finally:
        llm.shutdown()
