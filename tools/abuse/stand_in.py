"""The gateway process the CPU-side attacks run against: the real app over real uvicorn (as
``lora-gateway serve`` runs it, connection guards included), the real tokenizer and context
length of the base model, and a stand-in engine that costs next to nothing behind them.

``python -m tools.abuse.stand_in --workdir DIR --port P`` serves until SIGINT.

The stand-in is :class:`tools.gateway_cost.engine.PacedEngine` stepping at a fixed interval
whatever its batch (on an accelerator a decode step barely grows with the batch): a tenant's
many streams then cost the victim nothing in the engine, and what the victim waits for is the
gateway in front of it, which is what these rows measure.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from app.engine.base import Engine, EngineLoad
from app.main import create_app
from app.server import run
from app.settings import EMBEDDED_MODEL_DIR, Settings
from tools.gateway_cost.engine import PacedEngine

STEP_SECONDS = 0.02
"""One decode step of the stand-in: every running request gets a token."""


class StandInEngine(PacedEngine):
    """:class:`PacedEngine`'s outputs with the model's own tokenizer and context length, one
    step every ``step_seconds`` whatever the batch."""

    def __init__(self, tokenizer: Any, max_model_len: int, step_seconds: float) -> None:
        super().__init__(tokens_per_second=1.0, max_model_len=max_model_len)
        self._tokenizer = tokenizer
        self.step_seconds = step_seconds

    def load(self) -> EngineLoad:
        """Every unfinished request runs: nothing waits inside the engine (as the serving
        tests' scripted engine reports), so the fair scheduler's window stays open."""
        running = self.num_unfinished_requests()
        return EngineLoad(running=running, waiting=0, kv_cache_usage=0.0, step=self.steps)

    def step_interval(self) -> float:
        return self.step_seconds


def settings_for(workdir: Path, port: int, admin_token: str) -> Settings:
    """The defaults, as production runs them, but for where the state goes."""
    (workdir / "tenants").mkdir(parents=True, exist_ok=True)
    return Settings(
        _env_file=None,
        model=str(EMBEDDED_MODEL_DIR),
        database_url=f"sqlite+aiosqlite:///{workdir / 'gateway.db'}",
        adapter_root=workdir / "adapters",
        adapter_cache_dir=workdir / "adapter-cache",
        tenants_dir=workdir / "tenants",
        admin_token=admin_token,
        host="127.0.0.1",
        port=port,
        log_level="warning",
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--admin-token", required=True)
    parser.add_argument("--step-seconds", type=float, default=STEP_SECONDS)
    args = parser.parse_args(argv)
    settings = settings_for(args.workdir, args.port, args.admin_token)

    @asynccontextmanager
    async def stand_in(settings: Settings) -> AsyncIterator[Engine]:
        from vllm.tokenizers import get_tokenizer

        # The tokenizer vLLM would load for the model (the front role loads it the same way).
        model_dir = str(settings.model_dir(weights=False))
        tokenizer: Any = await asyncio.to_thread(lambda: get_tokenizer(model_dir))
        engine = StandInEngine(tokenizer, settings.max_model_len, args.step_seconds)
        try:
            yield engine
        finally:
            await engine.close()

    run(create_app(settings, engine_factory=stand_in), settings)


if __name__ == "__main__":
    main()
