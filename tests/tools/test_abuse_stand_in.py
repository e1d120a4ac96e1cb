"""The stand-in engine behind the CPU-side rows: the tokenizer it is given, and one step at a
fixed interval however many requests run (an attacker's streams cost a victim nothing in it)."""

from __future__ import annotations

import asyncio
import time

from vllm import SamplingParams

from tools.abuse.stand_in import StandInEngine
from tools.gateway_cost.engine import CharTokenizer


async def read(engine: StandInEngine, request_id: str, max_tokens: int) -> int:
    params = SamplingParams(max_tokens=max_tokens)
    outputs = [o async for o in engine.generate([1, 2], params, request_id, None)]
    return sum(len(o.outputs[0].token_ids) for o in outputs)


async def test_it_serves_the_tokenizer_and_context_it_was_given() -> None:
    tokenizer = CharTokenizer()
    engine = StandInEngine(tokenizer, 2048, step_seconds=0.01)
    assert engine.tokenizer is tokenizer
    assert engine.max_model_len == 2048
    load = engine.load()
    assert (load.running, load.waiting) == (0, 0)
    await engine.close()


async def test_a_step_takes_as_long_whatever_the_batch() -> None:
    engine = StandInEngine(CharTokenizer(), 2048, step_seconds=0.02)

    async def timed(streams: int) -> float:
        started = time.monotonic()
        reads = [read(engine, f"{streams}-{n}", 5) for n in range(streams)]
        running = asyncio.gather(*reads)
        while engine.num_unfinished_requests() < streams and not running.done():
            await asyncio.sleep(0)
        # The pace the engine steps at with the whole batch running (PacedEngine's would be
        # 50 times slower among 50).
        assert engine.step_interval() == 0.02
        assert await running == [5] * streams
        return time.monotonic() - started

    alone, crowded = await timed(1), await timed(50)
    await engine.close()
    # Five steps of 20 ms each at least, alone or among 50: a busy machine only adds to it.
    assert alone >= 0.09 and crowded >= 0.09
