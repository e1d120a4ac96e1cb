"""The real vLLM engine reports its load: what it runs, what waits in its own queue, after
every step (``VLLMEngine.load``, from the SchedulerStats vLLM hands our stat logger)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from vllm import SamplingParams

from app.engine.base import EngineLoad, ReportsLoad
from app.engine.vllm_engine import start_vllm_engine
from tests.e2e.conftest import make_settings

pytestmark = pytest.mark.slow


async def test_the_engine_reports_its_running_batch_and_its_own_queue(tmp_path: Path) -> None:
    async with start_vllm_engine(make_settings(tmp_path, max_num_seqs=2)) as engine:
        assert isinstance(engine, ReportsLoad)
        params = SamplingParams(max_tokens=24, ignore_eos=True)

        async def run(number: int) -> None:
            async for _ in engine.generate([1, 2, 3, number], params, f"load-{number}", None):
                pass

        seen: list[EngineLoad] = []
        runs = asyncio.gather(*(run(n) for n in range(4)))
        while not runs.done():
            if (load := engine.load()) is not None and (not seen or load.step != seen[-1].step):
                seen.append(load)
            await asyncio.sleep(0.005)
        await runs
        # Two seats (max_num_seqs): two run while two wait in vLLM's queue, then none.
        assert any(s.running == 2 and s.waiting == 2 for s in seen), seen
        assert all(s.running <= 2 and 0.0 <= s.kv_cache_usage <= 1.0 for s in seen)
        final = engine.load()
        assert final is not None and final.running == 0 and final.waiting == 0
        assert [s.step for s in seen] == sorted({s.step for s in seen})
