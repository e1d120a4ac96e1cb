"""How many times each request was paused, as vLLM's own per-request statistics count it.

vLLM counts a request's preemptions in the statistics each of its outputs carries
(``RequestOutput.metrics.num_preemptions``, from the engine core's ``PREEMPTED`` events); a
slot turn's pause, parked or preempted, is one of them. :func:`pause_counting` starts the
production engine and reads that count from each request's last output, on its way to the
gateway, which it leaves as it is.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from dataclasses import dataclass, field
from typing import cast

from vllm import RequestOutput, SamplingParams

from app.engine.base import Engine
from app.serving.in_process.backend import start_vllm_engine
from app.settings import Settings
from app.tenancy.adapters import Adapter


@dataclass(frozen=True)
class Paused:
    """One finished request: its adapter's name (None: the base model), and its pauses."""

    adapter: str | None
    pauses: int


@dataclass
class PauseCounts:
    """The requests an engine finished, in the order they finished."""

    finished: list[Paused] = field(default_factory=list)

    def since(self, start: int) -> list[Paused]:
        return self.finished[start:]


def pause_counting(
    counts: PauseCounts,
) -> Callable[[Settings], AbstractAsyncContextManager[Engine]]:
    """An engine factory: the production engine, each request it finishes added to
    ``counts``. vLLM must log statistics (the gateway's engine does), or there is no count."""

    @asynccontextmanager
    async def start(settings: Settings) -> AsyncIterator[Engine]:
        async with start_vllm_engine(settings) as engine:
            generate = engine.generate

            async def counted(
                prompt_token_ids: Sequence[int],
                params: SamplingParams,
                request_id: str,
                adapter: Adapter | None,
                cache_salt: str | None = None,
                on_abandoned: Callable[[RequestOutput], None] | None = None,
                trace_headers: Mapping[str, str] | None = None,
            ) -> AsyncIterator[RequestOutput]:
                stream = cast(  # vLLM's is an async generator, which closes
                    AsyncGenerator[RequestOutput, None],
                    generate(
                        prompt_token_ids,
                        params,
                        request_id,
                        adapter,
                        cache_salt,
                        on_abandoned,
                        trace_headers,
                    ),
                )
                async with aclosing(stream):  # closed, it aborts the request as it would
                    async for output in stream:
                        if output.finished:
                            assert output.metrics is not None, "vLLM logs no statistics"
                            name = adapter.name if adapter is not None else None
                            counts.finished.append(Paused(name, output.metrics.num_preemptions))
                        yield output

            engine.generate = counted  # type: ignore[method-assign]
            yield engine

    return start
