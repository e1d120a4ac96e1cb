"""The headroom on the real engine: one tenant's requests fill every seat of vLLM's batch, and
another tenant's request, let in through the fair front's headroom, runs at once in the seat
of one of them, which is parked and resumes where it stopped (docs/scheduling.md,
"Headroom")."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.engine.base import EngineLoad
from tests.support.live_gateway import LiveGateway

pytestmark = pytest.mark.slow

FLOODER = "demo-all"  # on the base model
NEWCOMER = "acme-legal"  # its adapter
FLOOD_TOKENS = 40
PROMPT = "Count from 1 to 100:"


def running(gateway: LiveGateway) -> int:
    """The requests the engine ran at its last step (none before its first report)."""
    load: EngineLoad | None = gateway.engine.load()  # type: ignore[attr-defined]
    return 0 if load is None else load.running


def test_a_newcomer_runs_at_once_in_a_seat_of_the_tenant_filling_the_batch(
    gateway: LiveGateway,
) -> None:
    seats = gateway.settings.max_num_seqs
    parked_before = gateway.samples("lora_gateway_headroom_seats_total", how="parked")

    async def scenario() -> tuple[list[str], float, float]:
        flooder, newcomer = gateway.async_client(FLOODER), gateway.async_client(NEWCOMER)

        async def flood_one() -> tuple[str, float]:
            answer = await flooder.completions.create(
                model=gateway.settings.base_model_id,
                prompt=PROMPT,
                max_tokens=FLOOD_TOKENS,
                temperature=0,
                extra_body={"ignore_eos": True},
            )
            assert answer.usage is not None
            assert answer.usage.completion_tokens == FLOOD_TOKENS
            return answer.choices[0].text, time.monotonic()

        flood = [asyncio.create_task(flood_one()) for _ in range(seats)]
        deadline = time.monotonic() + 120
        while running(gateway) < seats:
            assert time.monotonic() < deadline, "the flood never filled the batch"
            assert not any(task.done() for task in flood), "a flood request ended first"
            await asyncio.sleep(0.02)
        answer = await newcomer.completions.create(
            model="legal_advisor", prompt="Hello", max_tokens=2, temperature=0
        )
        assert answer.usage is not None and answer.usage.completion_tokens >= 1
        served = time.monotonic()
        ended = await asyncio.gather(*flood)
        return [text for text, _ in ended], served, min(at for _, at in ended)

    texts, newcomer_served, first_flood_end = asyncio.run(scenario())
    # Served while every request of the flood still ran: it did not wait for a seat to free.
    assert newcomer_served < first_flood_end
    # One of the flood's requests gave its seat, parked with its KV blocks, and resumed where
    # it stopped: every answer of the same greedy prompt is the same.
    parked = gateway.samples("lora_gateway_headroom_seats_total", how="parked")
    assert parked - parked_before == 1
    assert len(set(texts)) == 1
    assert gateway.wait_idle() == 0
