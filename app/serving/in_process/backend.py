"""The ``all`` role's backend: requests run on the vLLM engine in this process, behind the
gateway's own adapter-aware admission (:mod:`app.scheduling`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING

from app.engine.base import Engine
from app.scheduling import admission_for
from app.serving.in_process.chat import ChatService
from app.serving.in_process.completions import CompletionService
from app.serving.preparation.chat import ChatPreparation
from app.serving.preparation.completions import CompletionPreparation
from app.serving.preparation.generation import warm_tokenizer
from app.serving.preparation.structured import OutputConstraints
from app.settings import Settings
from app.tenancy.adapters import Adapter

if TYPE_CHECKING:
    # Annotations only: vLLM's tool parsers load where one is set (preparation.tools).
    from vllm.tool_parsers import ToolParser

logger = logging.getLogger(__name__)

EngineFactory = Callable[[Settings], AbstractAsyncContextManager[Engine]]


def start_vllm_engine(
    settings: Settings, *, otlp_traces_endpoint: str | None = None
) -> AbstractAsyncContextManager[Engine]:
    """The production engine factory: vLLM's in-process engine (tracing the requests that come
    with trace headers where ``otlp_traces_endpoint`` is given or ``OTEL_*`` turns tracing
    on)."""
    from app.engine.vllm_engine import start_vllm_engine as start  # imports vLLM: only when used

    return start(settings, otlp_traces_endpoint=otlp_traces_endpoint)


class InProcessBackend:
    """The engine in this process, and the chat and completion services running on it."""

    def __init__(
        self,
        engine: Engine,
        constraints: OutputConstraints,
        tool_parser: type[ToolParser] | None,
    ) -> None:
        self.engine = engine
        self.chat = ChatService(ChatPreparation(engine, constraints, tool_parser), engine)
        self.completions = CompletionService(CompletionPreparation(engine, constraints), engine)

    async def check_ready(self) -> None:
        await self.engine.check_health()

    async def check_alive(self) -> None:
        await self.engine.check_health()

    async def retire(self, adapter: Adapter) -> None:
        await self.engine.remove_adapter(adapter)


class InProcessFactory:
    name = "the inference engine"
    holds_adapter_copies = True

    def __init__(self, settings: Settings, engine_factory: EngineFactory) -> None:
        self._settings = settings
        self._engine_factory = engine_factory
        self.admission = admission_for(settings)

    @asynccontextmanager
    async def open(
        self, constraints: OutputConstraints, tool_parser: type[ToolParser] | None
    ) -> AsyncIterator[InProcessBackend]:
        async with self._engine_factory(self._settings) as engine:
            with constraints.checking(engine.tokenizer) as checked:
                await asyncio.to_thread(warm_tokenizer, engine.tokenizer, checked)
                self.admission.follow(engine)
                logger.info("engine ready: serving %s", self._settings.model)
                try:
                    yield InProcessBackend(engine, checked, tool_parser)
                finally:
                    self.admission.follow(None)
