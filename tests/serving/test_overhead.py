"""The gateway's own time per request, by phase: observed once each request is settled, and
in a header only where the deployment asks for it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from prometheus_client import REGISTRY

from app import metrics, overhead
from app.overhead import PHASES, Phase, RequestOverhead
from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import ServeFactory


def observed(phase: str, suffix: str = "count") -> float:
    metrics.flush_held()
    value = REGISTRY.get_sample_value(
        f"lora_gateway_overhead_seconds_{suffix}", {"role": "all", "phase": phase}
    )
    return value or 0.0


async def settled(before: dict[str, float], requests: int) -> None:
    """Until every phase has ``requests`` more observations (settlement runs after the
    response)."""
    deadline = time.monotonic() + 30
    while any(observed(phase) < before[phase] + requests for phase in PHASES):
        assert time.monotonic() < deadline, {p: observed(p) - before[p] for p in PHASES}
        await asyncio.sleep(0.02)


def chat(model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **fields}


async def test_each_request_is_observed_by_phase_and_the_header_is_off_by_default(
    serve: ServeFactory,
) -> None:
    async with serve(ScriptedEngine()) as served, served.client() as client:
        before = {phase: observed(phase) for phase in PHASES}
        engine_before = observed("engine", "sum")
        answer = await client.post("/v1/chat/completions", json=chat(served.model, max_tokens=3))
        assert answer.status_code == 200
        assert overhead.HEADER not in answer.headers
        body = chat(served.model, max_tokens=3, stream=True)
        async with client.stream("POST", "/v1/chat/completions", json=body) as streamed:
            assert streamed.status_code == 200
            assert overhead.HEADER not in streamed.headers
            await streamed.aread()
        await settled(before, 2)
        assert observed("engine", "sum") > engine_before, "the outputs' way back was not timed"
        # A request refused before it ran is not a request's overhead.
        refused = await client.post("/v1/chat/completions", json=chat("no-such-model"))
        assert refused.status_code == 404
        await asyncio.sleep(0.1)
        assert observed("authentication") == before["authentication"] + 2


async def test_the_header_says_the_overhead_until_the_response_started(
    serve: ServeFactory,
) -> None:
    async with serve(ScriptedEngine(), overhead_header=True) as served, served.client() as client:
        answer = await client.post("/v1/chat/completions", json=chat(served.model, max_tokens=2))
        body = chat(served.model, max_tokens=2, stream=True)
        async with client.stream("POST", "/v1/chat/completions", json=body) as streamed:
            await streamed.aread()
    for response in (answer, streamed):
        assert response.status_code == 200
        assert float(response.headers[overhead.HEADER]) > 0


class Recording:
    def __init__(self) -> None:
        self.seen: list[tuple[str, Phase]] = []

    def began(self, request: RequestOverhead, phase: Phase) -> None:
        self.seen.append(("began", phase))

    def ended(self, request: RequestOverhead, phase: Phase, seconds: float) -> None:
        self.seen.append(("ended", phase))


def test_phases_count_only_their_own_time_and_a_hook_sees_their_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [10.0]
    monkeypatch.setattr(overhead, "clock", lambda: now[0])
    hook = Recording()
    overhead.set_hook(hook)
    try:
        request = RequestOverhead("front", header=True)
        request.begin("authentication")
        now[0] += 0.002
        request.end("authentication")
        now[0] += 5.0  # the fair queue, the engine: nobody's phase
        request.add("engine", 0.001)
        request.add("engine", 0.0005)
    finally:
        overhead.set_hook(None)
    assert request.seconds("authentication") == pytest.approx(0.002)
    assert request.seconds("engine") == pytest.approx(0.0015)
    assert request.header() == (overhead.HEADER, "3.500")
    assert hook.seen == [
        ("began", "authentication"),
        ("ended", "authentication"),
        ("ended", "engine"),
        ("ended", "engine"),
    ]
