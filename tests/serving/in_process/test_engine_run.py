"""Closing an engine run counts what its stream produced, even when the drain fails."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import pytest
from vllm import CompletionOutput, RequestOutput, SamplingParams

from app import metrics
from app.serving.in_process import token_meter
from app.serving.in_process.engine_run import EngineRun
from app.serving.preparation.generation import Generation
from app.tenancy.adapters import Adapter
from app.tenancy.tenants import ApiKey, ModelTarget, Principal, Tenant
from tests.support.own_metrics import OwnMetrics


def output(tokens: int) -> RequestOutput:
    choice = CompletionOutput(
        index=0,
        text="x" * tokens,
        token_ids=list(range(tokens)),
        cumulative_logprob=None,
        logprobs=None,
        finish_reason=None,
    )
    return RequestOutput("r", None, [1], None, [choice], finished=False)


class AbortFailsEngine:
    """Streams a few tokens, then never finishes; aborting it fails."""

    max_model_len = 64
    tokenizer: Any = None

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
        for _ in range(4):
            await asyncio.sleep(0.001)
            yield output(1)
        await asyncio.Event().wait()

    async def abort(self, request_id: str) -> None:
        raise ConnectionError("the engine is gone")

    async def remove_adapter(self, adapter: Adapter) -> None:
        pass

    async def check_health(self) -> None:
        pass

    def num_unfinished_requests(self) -> int:
        return 1


# Counted in metrics of this module's own: the process's move to a new storage whenever a
# gateway of another test starts or stops (tests/support/own_metrics.py).
TOKEN_METRICS = OwnMetrics("INTER_TOKEN_LATENCY", "TIME_TO_FIRST_TOKEN")


@pytest.fixture(autouse=True)
def token_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    TOKEN_METRICS.install(monkeypatch, token_meter)


def itl_count(tenant: str) -> float:
    metrics.flush_held()
    return TOKEN_METRICS.value(
        "lora_gateway_inter_token_latency_seconds_count", tenant=tenant, model="m"
    )


async def test_the_gaps_counted_before_a_drain_that_fails_are_kept() -> None:
    run = EngineRun(AbortFailsEngine(), chat_generation("run-drain-fails"), None)
    outputs = run.outputs()
    for _ in range(4):
        await anext(outputs)
    assert run.completion_tokens == 4
    await run.close()
    assert run.outcome() == "cancelled"
    assert itl_count("run-drain-fails") == 3


class FinishingEngine(AbortFailsEngine):
    """Streams three tokens, the last one finishing the request."""

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
        for number in range(3):
            last = output(1)
            last.finished = number == 2
            yield last


def chat_generation(tenant_id: str) -> Generation:
    tenant = Tenant(id=tenant_id, name="t")
    principal = Principal(tenant=tenant, key=ApiKey(id="k", tenant_id=tenant.id, sha256="0"))
    target = ModelTarget(model="m", adapter=None)
    return Generation("r", "chat", principal, target, [1, 2], SamplingParams())


async def test_the_end_is_told_as_the_last_output_arrives_with_its_counts() -> None:
    run = EngineRun(FinishingEngine(), chat_generation("run-ends"), None)
    told: list[int] = []
    run.when_ended(lambda: told.append(run.completion_tokens))
    read = []
    async for out in run.outputs():
        read.append(out)
        assert told == ([3] if out.finished else [])
    await run.close()
    assert told == [3] and len(read) == 3


async def test_a_request_cut_short_never_tells_its_end() -> None:
    run = EngineRun(AbortFailsEngine(), chat_generation("run-cut"), None)
    told: list[int] = []
    run.when_ended(lambda: told.append(run.completion_tokens))
    outputs = run.outputs()
    await anext(outputs)
    await run.close()
    assert told == []
